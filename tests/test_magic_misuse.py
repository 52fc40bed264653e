"""Misuse of the magics: every argument string ends in a parsed result or a UsageError.

No cluster is needed: each magic's line is split, parsed and checked by a pure
``parse_*_args`` function before anything runs. Property tests throw arbitrary text
and arbitrary combinations of flags and hostile values at every one of them; explicit
cases pin each reported misuse (non-finite timeouts, ``--processes ,``, ``--step ٣``,
quoted directories, barrier names that are paths, unbalanced quotes).
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from nbckpt.magics import args as a
from nbckpt.magics.commands import NbckptMagics
from nbckpt.magics.rollback import ROLLBACK, parse_rollback_args
from nbckpt.protocol import (
    DEFAULT_BARRIER_TIMEOUT_S,
    DEFAULT_SAVE_TIMEOUT_S,
    FORMATS,
    MODES,
    PHASES,
    check_name,
)

# Bounded so that the whole module runs in seconds; no example database in the tree.
FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

PARSERS: dict[str, Callable[[str], Any]] = {
    "ckpt_cluster": a.parse_cluster_args,
    "ckpt_save": a.parse_save_args,
    "ckpt_wait": a.parse_wait_args,
    "ckpt_barrier": a.parse_barrier_args,
    "ckpt_restore": a.parse_restore_args,
    "ckpt_status": a.parse_status_args,
    "ckpt_ls": a.parse_ls_args,
    "ckpt_fault": a.parse_fault_args,
    "ckpt_fsck": a.parse_fsck_args,
    "ckpt_show": a.parse_show_args,
    "ckpt_timeline": a.parse_timeline_args,
    "ckpt_retention": a.parse_retention_args,
    "ckpt_watch": a.parse_watch_args,
    "ckpt_rollback": parse_rollback_args,
    "ckpt_tiers": a.parse_tiers_args,
}
SPECS = {
    "ckpt_cluster": a.CLUSTER,
    "ckpt_save": a.SAVE,
    "ckpt_wait": a.WAIT,
    "ckpt_barrier": a.BARRIER,
    "ckpt_restore": a.RESTORE,
    "ckpt_status": a.STATUS,
    "ckpt_ls": a.LS,
    "ckpt_fault": a.FAULT,
    "ckpt_fsck": a.FSCK,
    "ckpt_show": a.SHOW,
    "ckpt_timeline": a.TIMELINE,
    "ckpt_retention": a.RETENTION,
    "ckpt_watch": a.WATCH,
    "ckpt_rollback": ROLLBACK,
    "ckpt_tiers": a.TIERS,
}


def _valid_dir(d: str | None) -> bool:
    return d is None or (d.strip() != "" and "\0" not in d)


def _valid_seconds(s: float | None) -> bool:
    return s is None or (math.isfinite(s) and 0 < s <= a.MAX_TIMEOUT_S)


def _check_result(magic: str, result: Any) -> None:
    """The invariants every parsed result keeps: what the engines may rely on."""
    if result is None:
        assert magic in ("ckpt_wait", "ckpt_status")
        return
    if isinstance(result, a.RetentionArgs) and result.policy is not None:
        p = result.policy
        for n in (p.max_to_keep, p.keep_period, p.best_n, p.save_interval_steps):
            assert n is None or (type(n) is int and n >= 1)
        assert (p.best_n is None) == (p.best_metric is None)
    if hasattr(result, "directory"):
        assert _valid_dir(result.directory)
    if hasattr(result, "timeout_s"):
        assert _valid_seconds(result.timeout_s) and result.timeout_s is not None
    if hasattr(result, "var"):
        assert result.var.isidentifier()
    if isinstance(result, a.SaveArgs | a.RestoreArgs) and result.step is not None:
        assert type(result.step) is int and 0 <= result.step <= a.MAX_STEP
    if isinstance(result, a.SaveArgs):
        assert result.mode is None or result.mode in MODES
        assert result.format in FORMATS
        assert all(math.isfinite(v) and check_name(k, "metric") for k, v in result.metrics.items())
    if isinstance(result, a.BarrierArgs):
        assert check_name(result.name) == result.name
        if result.processes is not None:
            assert result.processes and result.processes == sorted(set(result.processes))
            assert all(0 <= p < a.MAX_PROCESSES for p in result.processes)
    if isinstance(result, a.FaultArgs):
        assert _valid_seconds(result.seconds)
        assert result.factor is None or 1 <= result.factor <= a.MAX_IO_FACTOR
        assert result.at is None or result.at in PHASES
        assert (result.process is None) == (result.action in ("list", "clear"))
        assert result.process is None or 0 <= result.process < a.MAX_PROCESSES
    if isinstance(result, a.ClusterArgs):
        assert 1 <= result.options.n <= a.MAX_PROCESSES
        assert 1 <= result.options.devices_per_process <= a.MAX_PROCESSES
    if isinstance(result, a.OpArgs | a.TimelineArgs):
        assert result.op is None or result.op.strip()
    if isinstance(result, a.WatchArgs):
        assert type(result.last) is int and 1 <= result.last <= 1000
        assert not (result.stop and result.directory is not None)
    if isinstance(result, a.TimelineArgs) and result.last is not None:
        assert type(result.last) is int and 1 <= result.last <= 100 and result.op is None
    if isinstance(result, a.TiersArgs):
        counts = (result.replicas, result.persistent_every, result.keep)
        assert all(n is None or type(n) is int for n in counts)
        assert (result.replicas or 0) >= 0 and all(n is None or n >= 1 for n in counts[1:])
        if result.off or result.local is None:
            assert counts == (None, None, None) and not (result.off and result.local)
        else:
            assert os.path.isabs(result.local) or result.local.startswith("~")
    if isinstance(result, a.TimelineArgs) and result.save is not None:
        assert result.save.lower().endswith(".png")


def _outcome(magic: str, line: str) -> str:
    """Parse ``line``: "ok" or "usage"; anything else raised fails the test."""
    try:
        result = PARSERS[magic](line)
    except UsageError as e:
        # A usage message says what is wrong, then how to call the magic.
        assert str(e).strip() and f"usage: %{magic}" in str(e), str(e)
        return "usage"
    _check_result(magic, result)
    return "ok"


# -- property tests -------------------------------------------------------------------

# Values a user (or a cat on the keyboard) might give any option or positional.
HOSTILE = [
    "",
    " ",
    "0",
    "1",
    "-1",
    "-0",
    "2",
    "0.5",
    "1e309",
    "-1e309",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e9",
    "٣",
    "²",
    "½",
    "\uff11",
    ",",
    "0,",
    ",0",
    "0,,1",
    "0,1",
    "1,0,1",
    "a,b",
    "+1",
    "1_000",
    "0x10",
    " 1",
    "9" * 30,
    "9" * 5000,
    "latest",
    "state",
    "x",
    "class",
    "a.b",
    "../../x",
    "..",
    ".hidden",
    "a-b",
    "b" * 65,
    "/a b",
    "/tmp/ckpt",
    "t.png",
    "t.jpg",
    "rename",
    "commit_file",
    "copy",
    "start",
    "stop",
    "status",
    "attach",
    "restart",
    "kill",
    "stall",
    "slow-io",
    "fail-io",
    "list",
    "clear",
    "write",
    "finalize",
    "barrier:tmp_ready",
    "nowhere",
    "\0",
    "a\0b",
    "é",
    "'",
    '"',
    "\\",
    "-",
    "--",
    "-h",
    "--help",
    "=",
    "loss=0.3",
    "loss=nan",
    "=1",
    "orbax",
    "nbckpt",
    "min",
    "max",
]
FLAGS = [
    "--step",
    "--dir",
    "--mode",
    "--wait",
    "--force",
    "--timeout",
    "--quiet",
    "--processes",
    "--process",
    "--at",
    "--seconds",
    "--factor",
    "--clean",
    "--verify",
    "--save",
    "-n",
    "--devices-per-process",
    "--coordinator-host",
    "--profile",
    "--cluster-id",
    "--dir=",
    "--timeout=",
    "--step=",
    "--st",
    "--ti",
    "--d",
    "--metric",
    "--format",
    "--max-to-keep",
    "--keep-period",
    "--best",
    "--best-mode",
    "--interval",
    "--keep-all",
    "--item",
    "--local",
    "--replicas",
    "--persistent-every",
    "--keep",
    "--off",
    "--persistent",
]
token = st.one_of(st.sampled_from(HOSTILE), st.sampled_from(FLAGS), st.text(max_size=8))
# Tokens joined as a shell would read them back (quoted), or raw (quotes and all).
structured_line = st.one_of(
    st.lists(token, max_size=8).map(shlex.join),
    st.lists(token, max_size=8).map(" ".join),
)


@pytest.mark.parametrize("magic", sorted(PARSERS))
@FUZZ
@given(line=st.text(max_size=80))
def test_any_text_parses_or_gives_a_usage_error(magic: str, line: str) -> None:
    _outcome(magic, line)


@pytest.mark.parametrize("magic", sorted(PARSERS))
@FUZZ
@given(line=structured_line)
def test_any_flags_and_values_parse_or_give_a_usage_error(magic: str, line: str) -> None:
    _outcome(magic, line)


# A good line per magic: appending flags and values to it explores the lines that
# almost parse, where a check that is too loose would let a bad value through.
GOOD = {
    "ckpt_cluster": "start -n 2",
    "ckpt_save": "state --step 1",
    "ckpt_wait": "",
    "ckpt_barrier": "b",
    "ckpt_restore": "x",
    "ckpt_status": "",
    "ckpt_ls": "",
    "ckpt_fault": "stall --process 0 --at write --seconds 1",
    "ckpt_fsck": "",
    "ckpt_show": "",
    "ckpt_timeline": "",
    "ckpt_retention": "--max-to-keep 3 --best 2 --metric loss",
    "ckpt_watch": "--last 5",
    "ckpt_rollback": "3",
    "ckpt_tiers": "/tmp/ckpt --local /dev/shm/h{process} --replicas 1 --persistent-every 5",
}


def test_the_good_lines_are_good():
    assert all(_outcome(magic, line) == "ok" for magic, line in GOOD.items())


# Values that fit some option, so that appended options often parse.
FITTING = ["1", "2", "2.5", "30", "0,1", "1,0", "write", "barrier:tmp_ready", "rename",
           "commit_file", "/tmp/x", "t.png", "op1", "host"]  # fmt: skip


def _own_options(magic: str) -> tuple[list[str], list[str]]:
    """The magic's switches (no value) and its options that take a value."""
    actions = SPECS[magic].parser._option_string_actions
    switches = sorted(f for f, x in actions.items() if x.nargs == 0) or ["--wait"]
    valued = sorted(f for f, x in actions.items() if x.nargs != 0) or ["--dir"]
    return switches, valued


@pytest.mark.parametrize("magic", sorted(PARSERS))
@FUZZ
@given(data=st.data())
def test_a_good_line_with_any_option_added_parses_or_gives_a_usage_error(
    magic: str, data: st.DataObject
) -> None:
    # Mostly the magic's own options with fitting values; sometimes anything at all.
    switches, valued = _own_options(magic)
    item = st.one_of(
        st.sampled_from(switches).map(lambda f: [f]),
        st.tuples(st.sampled_from(valued), st.sampled_from(FITTING)).map(list),
        st.tuples(st.sampled_from(valued), token).map(list),
        st.tuples(st.sampled_from(FLAGS), token).map(list),
    )
    extra = [x for pair in data.draw(st.lists(item, max_size=3)) for x in pair]
    _outcome(magic, f"{GOOD[magic]} {shlex.join(extra)}")


@FUZZ
@given(
    timeout=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(HOSTILE)
    ),
    which=st.sampled_from(["save", "barrier", "restore", "stall"]),
)
def test_every_timeout_is_finite_and_positive(timeout: str, which: str) -> None:
    magic, line = {
        "save": ("ckpt_save", f"state --step 1 --timeout {shlex.quote(timeout)}"),
        "barrier": ("ckpt_barrier", f"b --timeout {shlex.quote(timeout)}"),
        "restore": ("ckpt_restore", f"x --timeout {shlex.quote(timeout)}"),
        "stall": ("ckpt_fault", f"stall --process 0 --at write --seconds {shlex.quote(timeout)}"),
    }[which]
    outcome = _outcome(magic, line)
    try:
        value = float(timeout) if timeout.isascii() else math.nan
    except ValueError:
        value = math.nan
    assert (outcome == "ok") == (math.isfinite(value) and 0 < value <= a.MAX_TIMEOUT_S)


@FUZZ
@given(step=st.one_of(st.integers(), st.text(max_size=12), st.sampled_from(HOSTILE)))
def test_a_step_is_plain_digits_within_range(step: int | str) -> None:
    text = str(step)
    ok = _outcome("ckpt_save", f"state --step {shlex.quote(text)}") == "ok"
    plain = text.isascii() and text.isdigit() and len(text.lstrip("0")) <= 16
    assert ok == (plain and int(text) <= a.MAX_STEP)


@FUZZ
@given(
    parts=st.lists(
        st.one_of(st.integers(-3, 5000).map(str), st.sampled_from(["", " ", "٣", "a", "1.0"])),
        max_size=6,
    )
)
def test_processes_are_strict_indices(parts: list[str]) -> None:
    text = ",".join(parts)
    outcome = _outcome("ckpt_barrier", f"b --processes {shlex.quote(text)}")
    strict = bool(parts) and all(
        p.strip().isascii() and p.strip().isdigit() and int(p) < a.MAX_PROCESSES for p in parts
    )
    assert (outcome == "ok") == strict
    if strict:
        assert a.parse_barrier_args(f"b --processes {shlex.quote(text)}").processes == sorted(
            {int(p) for p in parts}
        )


@FUZZ
@given(
    directory=st.text(
        st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), min_size=1
    ).filter(str.strip)
)
def test_any_quoted_directory_arrives_as_typed(directory: str) -> None:
    # ``--dir=D`` and ``-- D``: argparse takes a value that starts with "-" for an option.
    # A leading ``~`` is the one rewrite: it names a home, as in a shell.
    quoted = shlex.quote(directory)
    typed = os.path.expanduser(directory)
    assert a.parse_save_args(f"state --step 1 --dir={quoted}").directory == typed
    assert a.parse_ls_args(f"-- {quoted}").directory == typed
    assert a.parse_fsck_args(f"--clean -- {quoted}").directory == typed
    if not directory.startswith("~"):
        assert typed == directory


@FUZZ
@given(name=st.one_of(st.text(max_size=70), st.sampled_from(HOSTILE)))
def test_a_barrier_name_is_never_a_path(name: str) -> None:
    outcome = _outcome("ckpt_barrier", shlex.quote(name))
    if outcome == "ok":
        parsed = a.parse_barrier_args(shlex.quote(name)).name
        assert "/" not in parsed and ".." not in parsed and not parsed.startswith(".")


NO_CLUSTER_MAGICS = [
    "ckpt_save",
    "ckpt_barrier",
    "ckpt_restore",
    "ckpt_wait",
    "ckpt_fault",
    "ckpt_tiers",
]


@pytest.fixture(scope="module")
def bare_magics() -> NbckptMagics:
    """Magics with no cluster, as in a fresh kernel (the shell is a plain one)."""
    from IPython.core.interactiveshell import InteractiveShell

    return NbckptMagics(InteractiveShell.instance())


@pytest.mark.parametrize("magic", NO_CLUSTER_MAGICS)
@FUZZ
@given(line=structured_line)
def test_a_magic_without_a_cluster_only_ever_says_how_to_use_it(
    bare_magics: NbckptMagics, magic: str, line: str
) -> None:
    # Parsed or not, nothing runs: a good line ends at "no cluster", a bad one earlier.
    with pytest.raises(UsageError):
        getattr(bare_magics, magic)(line)


# -- explicit regressions ---------------------------------------------------------------

BAD_TIMEOUTS = ["nan", "NaN", "inf", "-inf", "Infinity", "-1", "0", "0.0", "-0", "1e309",
                "1e9", "٣", "", "abc", "1,5"]  # fmt: skip


@pytest.mark.parametrize("value", BAD_TIMEOUTS)
@pytest.mark.parametrize(
    "magic,template",
    [
        ("ckpt_save", "state --step 1 --timeout {}"),
        ("ckpt_barrier", "b --timeout {}"),
        ("ckpt_restore", "x --timeout {}"),
        ("ckpt_fault", "stall --process 0 --at write --seconds {}"),
    ],
)
def test_non_finite_or_non_positive_timeouts_are_refused(magic, template, value):
    with pytest.raises(UsageError, match=f"usage: %{magic}"):
        PARSERS[magic](template.format(shlex.quote(value)))


@pytest.mark.parametrize(
    "line",
    [
        "slow-io --process 0 --factor nan",
        "slow-io --process 0 --factor inf",
        "slow-io --process 0 --factor 0.5",
        "slow-io --process 0 --factor 0",
        "slow-io --process 0 --factor -2",
        "slow-io --process 0 --factor 1e9",
        "slow-io --process 0 --factor ٣",
        "slow-io --process 0",
        "list --process 1",
        "clear --at write",
        "kill --process 0 --seconds 1",
        "slow-io --process 0 --factor 2 --at write",
        "stall --process 1 --seconds 2",
        "stall --process 1 --at write",
        "stall --process ٣ --at write --seconds 1",
        "kill --process -1",
        "kill --process 1.0",
        "kill",
        "fail-io --process 1 --at nowhere",
        "explode --process 1",
        "preempt",
        "preempt --process 1 --at write",
        "preempt --process 1 --seconds 2",
    ],
)
def test_fault_misuse(line):
    with pytest.raises(UsageError, match="usage: %ckpt_fault"):
        a.parse_fault_args(line)


def test_preempt_takes_a_process_only():
    args = a.parse_fault_args("preempt --process 2")
    assert (args.action, args.process, args.at, args.seconds) == ("preempt", 2, None, None)


@pytest.mark.parametrize(
    "value", [",", "", " ", "0,", ",0", "0,,1", "a,b", "-1", "٣", "0 1", "1.5", "9" * 30, "4096"]
)
def test_bad_process_lists_are_refused(value):
    with pytest.raises(UsageError, match="--processes"):
        a.parse_barrier_args(f"b --processes {shlex.quote(value)}")


def test_process_lists_are_sorted_and_unique():
    assert a.parse_barrier_args("b --processes 2,0,2").processes == [0, 2]
    assert a.parse_barrier_args("b --processes ' 1 , 0'").processes == [0, 1]
    assert a.parse_barrier_args("b").processes is None


@pytest.mark.parametrize(
    "value", ["٣", "²", "\uff11", "-1", "+1", "1.0", "1e3", " 1", "", "0x10", "1_000", "9" * 30]
)
def test_steps_are_plain_ascii_digits(value):
    with pytest.raises(UsageError, match="--step"):
        a.parse_save_args(f"state --step {shlex.quote(value)}")
    with pytest.raises(UsageError, match="--step"):
        a.parse_restore_args(f"x --step {shlex.quote(value)}")


def test_restore_step_and_timeout():
    assert a.parse_restore_args("x") == a.RestoreArgs(
        var="x", step=None, directory=None, timeout_s=DEFAULT_SAVE_TIMEOUT_S
    )
    assert a.parse_restore_args("x --step 007 --timeout 2.5").step == 7
    assert a.parse_restore_args("x --timeout 2.5").timeout_s == 2.5


@pytest.mark.parametrize(
    "line", ["start -n 0", "start -n -1", "start -n ٣", "start -n 100000", "start -n 2.0",
             "start --devices-per-process 0", "start --coordinator-host ''",
             "start --dir ''"],
)  # fmt: skip
def test_cluster_counts_are_checked(line):
    with pytest.raises(UsageError, match="usage: %ckpt_cluster"):
        a.parse_cluster_args(line)


@pytest.mark.parametrize(
    "line,message",
    [
        ("start --engines ssh", "needs --hosts"),
        ("start --hosts h0,h1", "--hosts is for --engines ssh"),
        ("start --engines ssh --hosts h0,,h1", "separated by commas"),
        ("start --engines ssh --hosts h0,h1 -n 3", "-n 3 but 2 --hosts"),
        ("start --ssh-config /x", "is for --engines ssh"),
        ("start --engines mpi --python /x", "is for --engines ssh"),
        ("start --engines ssh --hosts h0 --controller-ip ' '", "--controller-ip needs"),
        ("start --engines pbs", "invalid choice"),
        ("attach --cluster-id x --hosts h0", "--hosts only go with start, not attach"),
        ("attach --cluster-id x -n 2 --engines ssh", "-n, --engines only go with start"),
        ("restart --python /x", "--python only go with start"),
        ("start --timeout 0", "above 0"),
    ],
)
def test_launcher_misuse_gives_usage_errors(line, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        a.parse_cluster_args(line)


def test_launcher_lines_parse_to_what_was_meant():
    ssh = a.parse_cluster_args("start --engines ssh --hosts h0,me@h1:2222,h0 --python /v/py")
    assert ssh.options.n == 3 and ssh.options.python == "/v/py"
    assert ssh.options.hosts == ("h0", "me@h1:2222", "h0")
    assert ssh.options.coordinator_host is None and ssh.options.controller_ip is None
    assert a.parse_cluster_args("start --engines slurm -n 8").options.n == 8
    assert a.parse_cluster_args("start").options.n == 4
    assert a.parse_cluster_args("start").timeout_s == 120
    assert a.parse_cluster_args("attach --cluster-id '' --timeout 30").cluster_id == ""
    assert a.parse_cluster_args("start --profile p").options.profile == "p"


def test_attach_without_a_cluster_id_lists_the_ids_instead_of_picking_one(ip):
    with pytest.raises(UsageError, match=r"attach needs --cluster-id.*start prints its id"):
        ip.run_line_magic("ckpt_cluster", "attach")


@pytest.mark.parametrize(
    "line,directory",
    [
        ('state --step 1 --dir "/a b"', "/a b"),
        ("state --step 1 --dir '/a b'", "/a b"),
        ("state --step 1 --dir /a\\ b", "/a b"),
        ("state --step 1 --dir \"/a 'b'\"", "/a 'b'"),
        ('state --step 1 --dir="/x y"', "/x y"),
        ("state --step 1 --dir /plain", "/plain"),
    ],
)
def test_quotes_are_removed_as_a_shell_would(line, directory):
    assert a.parse_save_args(line).directory == directory


def test_every_magic_with_a_directory_unquotes_it():
    assert a.parse_ls_args('"/a b"').directory == "/a b"
    assert a.parse_fsck_args("'/a b' --verify").directory == "/a b"
    assert a.parse_restore_args('x --dir "/a b"').directory == "/a b"
    assert a.parse_show_args('op1 --dir "/a b"') == a.OpArgs(op="op1", directory="/a b")
    assert a.parse_status_args('--dir "/a b"') == a.OpArgs(op=None, directory="/a b")
    assert a.parse_timeline_args('--save "/a b/t.png"').save == "/a b/t.png"
    assert a.parse_cluster_args('start --dir "/a b"').directory == "/a b"


@pytest.mark.parametrize(
    "name", ["../../x", "a/b", "/abs", "..", ".hidden", "a..b", "a:b", "a b", "é", "b" * 65,
             "", "a\\b", "*"],
)  # fmt: skip
def test_barrier_names_that_could_leave_their_folder_are_refused(name):
    with pytest.raises(UsageError, match="barrier name"):
        a.parse_barrier_args(shlex.quote(name))


@pytest.mark.parametrize("magic", sorted(PARSERS))
@pytest.mark.parametrize("tail", ['"', "'", "\\", '--dir "/a', "--dir '/a b"])
def test_unbalanced_quotes_are_usage_errors(magic, tail):
    with pytest.raises(UsageError, match="as a shell would") as info:
        PARSERS[magic](f"x {tail}")
    assert f"usage: %{magic}" in str(info.value)


@pytest.mark.parametrize("magic", sorted(PARSERS))
def test_nul_characters_are_usage_errors(magic):
    with pytest.raises(UsageError, match="NUL"):
        PARSERS[magic]("x --dir a\0b")


@pytest.mark.parametrize(
    "magic,line",
    [
        ("ckpt_save", "1abc --step 1"),
        ("ckpt_save", "a.b --step 1"),
        ("ckpt_save", "class --step 1"),
        ("ckpt_restore", "'' --step 1"),
        ("ckpt_save", "state --step 1 --dir ''"),
        ("ckpt_save", "state --step 1 --dir ' '"),
        ("ckpt_save", "state --step 1 --mode copy"),
        ("ckpt_save", "state"),
        ("ckpt_save", "state --step 1 -h"),
        ("ckpt_ls", "''"),
        ("ckpt_ls", "a b"),
        ("ckpt_fsck", "''"),
        ("ckpt_show", "''"),
        ("ckpt_timeline", "--save t.jpg"),
        ("ckpt_timeline", "a b"),
        ("ckpt_timeline", "--last 0"),
        ("ckpt_timeline", "op --last 2"),
        ("ckpt_watch", "--last 0"),
        ("ckpt_watch", "--last many"),
        ("ckpt_watch", "ckpt --stop"),
        ("ckpt_watch", "a b"),
        ("ckpt_wait", "now"),
        ("ckpt_wait", "''"),
        ("ckpt_cluster", "explode"),
        ("ckpt_cluster", ""),
        ("ckpt_tiers", "--local ''"),
        ("ckpt_tiers", "--local rel/dir"),
        ("ckpt_tiers", "--local /x --replicas -1"),
        ("ckpt_tiers", "--local /x --persistent-every 0"),
        ("ckpt_tiers", "--local /x --keep 0"),
        ("ckpt_tiers", "--keep 3"),
        ("ckpt_tiers", "--off --local /x"),
        ("ckpt_tiers", "--off --replicas 2"),
        ("ckpt_tiers", "a b"),
        ("ckpt_tiers", "''"),
    ],
)
def test_other_misuse_gives_usage_errors(magic, line):
    with pytest.raises(UsageError, match=f"usage: %{magic}"):
        PARSERS[magic](line)


def test_good_lines_parse_to_what_was_meant():
    assert a.parse_save_args("state --step 3 --mode commit_file --wait --timeout 5") == (
        a.SaveArgs(
            var="state",
            step=3,
            directory=None,
            mode="commit_file",
            wait=True,
            force=False,
            timeout_s=5.0,
            quiet=False,
        )
    )
    assert a.parse_barrier_args("sync").timeout_s == DEFAULT_BARRIER_TIMEOUT_S
    assert a.parse_save_args("state --step 1").timeout_s == DEFAULT_SAVE_TIMEOUT_S
    assert a.parse_fault_args("stall --process 1 --at barrier:write_complete --seconds 1.5") == (
        a.FaultArgs(
            action="stall", process=1, at="barrier:write_complete", seconds=1.5, factor=None
        )
    )
    assert a.parse_fault_args("slow-io --process 2 --factor 3").factor == 3.0
    assert a.parse_fault_args("list").process is None
    assert a.parse_status_args("") is None
    assert a.parse_wait_args("  ") is None
    assert a.parse_cluster_args("start -n 2 --devices-per-process 2").options.n == 2
    assert a.parse_save_args("x --step 1").persistent is None
    assert a.parse_save_args("x --step 1 --persistent").persistent is True
    line = "/ck --local /dev/shm/h{process} --replicas 0 --persistent-every 10 --keep 3"
    assert a.parse_tiers_args(line) == a.TiersArgs(
        directory="/ck",
        local="/dev/shm/h{process}",
        replicas=0,
        persistent_every=10,
        keep=3,
        off=False,
    )
    assert a.parse_tiers_args("").report_only and not a.parse_tiers_args("--off").report_only
    # Each host expands its own ~: the notebook's home may not be theirs.
    assert a.parse_tiers_args("--local ~/shm").local == "~/shm"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--keep 3", "--replicas, --persistent-every and --keep go with --local DIR"),
        ("--off --local /x", "--off turns the local tier off; give it alone"),
        ("--local x", "--local must be absolute"),
        ("--local /x --persistent-every 0", "--persistent-every must be from 1"),
    ],
)
def test_tier_misuse_says_what_is_wrong_in_one_line(line, message):
    with pytest.raises(UsageError, match=re.escape(message)) as info:
        a.parse_tiers_args(line)
    assert str(info.value).count("\n") == 1  # the message, then the usage line


@pytest.mark.parametrize("magic", sorted(SPECS))
def test_help_is_the_parser_that_parses(magic):
    """``%magic?`` shows the method's parser; the parse functions use the spec's."""
    method = getattr(NbckptMagics, magic)

    def options(parser):
        return sorted((tuple(x.option_strings), x.dest, x.default) for x in parser._actions)

    assert options(method.parser) == options(SPECS[magic].parser)
    assert method.__doc__.startswith("::") and f"%{magic}" in method.__doc__


def test_help_tells_the_defaults_the_code_uses():
    assert f"(default {DEFAULT_SAVE_TIMEOUT_S:g})" in NbckptMagics.ckpt_save.__doc__
    assert f"(default {DEFAULT_BARRIER_TIMEOUT_S:g})" in NbckptMagics.ckpt_barrier.__doc__
    assert "--timeout SECONDS" in NbckptMagics.ckpt_restore.__doc__
    for phase in PHASES:
        assert phase in " ".join(NbckptMagics.ckpt_fault.__doc__.split())


# -- a flag given twice, a metric that is not a number, a path under ~ -----------------


@pytest.mark.parametrize(
    ("parse", "line", "flag"),
    [
        (a.parse_save_args, "x --step 1 --step 2", "--step"),
        (a.parse_save_args, "x --step=1 --step 2", "--step"),
        (a.parse_save_args, "x --step 1 --st 2", "--step"),  # argparse's abbreviation
        (a.parse_save_args, "x --step 1 --dir a --dir b", "--dir"),
        (a.parse_restore_args, "x --step 1 --timeout 5 --timeout 6", "--timeout"),
        (a.parse_cluster_args, "start -n 2 -n3", "-n"),
    ],
)
def test_a_flag_given_twice_is_refused_by_name(parse, line, flag):
    with pytest.raises(UsageError, match=rf"^{re.escape(flag)} is given twice"):
        parse(line)


def test_repeatable_flags_may_repeat():
    args = a.parse_save_args("x --step 1 --metric loss=1 --metric acc=0.5")
    assert args.metrics == {"loss": 1.0, "acc": 0.5}


def test_a_metric_that_is_not_a_number_says_so():
    with pytest.raises(UsageError, match=r"--metric loss: 'abc' is not a number") as info:
        a.parse_save_args("x --step 1 --metric loss=abc")
    assert "nan" not in str(info.value)


def test_paths_under_home_are_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert a.parse_save_args("x --step 1 --dir ~/ck").directory == f"{tmp_path}/ck"
    assert a.parse_cluster_args("start --dir ~/ck").directory == f"{tmp_path}/ck"
    assert a.parse_ls_args("~/ck").directory == f"{tmp_path}/ck"


def test_a_bad_phase_lists_the_phases_by_their_values():
    with pytest.raises(UsageError) as info:
        a.parse_fault_args("kill --process 1 --at bogus")
    msg = str(info.value)
    assert "'snapshot'" in msg and "<Phase" not in msg


@pytest.mark.parametrize(
    ("tail", "stale"), [("", None), ("--stale-after 0", 0.0), ("--stale-after 2.5", 2.5)]
)
def test_fsck_takes_a_stale_after_of_zero_or_more_seconds(tail: str, stale: float | None) -> None:
    assert a.parse_fsck_args(f"--clean {tail}").stale_after_s == stale


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc", "1e3", "٣"])
def test_fsck_refuses_a_stale_after_that_is_not_seconds(value: str) -> None:
    with pytest.raises(UsageError, match="--stale-after must be a number of seconds >= 0"):
        a.parse_fsck_args(f"--stale-after {value}")
