/**
 * The per-process timeline of one operation, as an SVG: the one picture of a save that
 * both the Checkpoints sidebar and the live progress widget draw.
 *
 * It reads the merged journal (`nbckpt.journal.OperationRecord.to_dict()`), its `view`
 * (`nbckpt.views.timeline.timeline_view`: when the step committed, why a row failed,
 * whom each barrier wait waited for, all decided in Python) and a few protocol names,
 * and nothing else: no request, no JupyterLab package, so the widget's
 * bundle (`jlpm build:widget`) can include it and run in any Jupyter front end. Every
 * colour comes from the `--nbckpt-*` CSS properties of `style/palette.css`.
 */
import type { IOperation, IPhase, IProcess } from './model';
import type { IProtocol } from './protocol';

/** The protocol names the timeline needs: any `IProtocol`, or the widget's trait. */
export type ITimelineNames = Pick<
  IProtocol,
  'barrier_prefix' | 'statuses' | 'phase_names'
>;

/**
 * What the timeline draws: the merged journal. The server's answer carries `root` and
 * `time` besides; the widget's `timeline` trait carries `now` (the kernel's clock).
 */
export type ITimelineOperation = Pick<
  IOperation,
  | 'op'
  | 'kind'
  | 'status'
  | 'start'
  | 'end'
  | 'process_count'
  | 'processes'
  | 'view'
> & { time?: number; now?: number };

/** How to draw. */
export interface ITimelineOptions {
  /**
   * The wall time (seconds) that open spans reach while the operation runs. Default:
   * the operation's `now`, else the latest time its journal shows.
   */
  now?: number;
  /**
   * Write each failed process's error under its row (default true). The widget,
   * whose table already shows every error in full, turns this off.
   */
  errors?: boolean;
}

const SVG_NS = 'http://www.w3.org/2000/svg';
const LABEL = 28; // the process labels' column
const RIGHT = 8;
const TOP = 14; // room for the commit marker's label
const ROW = 20;
const GAP = 6;
const LINE = 13; // one line of an error under its row
const AXIS = 18;
const MAX_ERROR_LINES = 3;
// An 11 px sans-serif character is at most about this wide; used to decide whether a
// label fits before the SVG is in the page (where it could be measured).
const CHAR = 6.2;

let drawn = 0; // makes each SVG's pattern id unique in the page

function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number>
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    el.setAttribute(key, String(value));
  }
  return el;
}

function titled<T extends SVGElement>(el: T, text: string): T {
  const title = svg('title', {});
  title.textContent = text;
  el.appendChild(title);
  return el;
}

/** Whether a phase name is a barrier wait (`<barrier_prefix><name>`). */
export function isBarrierPhase(names: ITimelineNames, phase: string): boolean {
  return phase.startsWith(names.barrier_prefix);
}

/** The colour role of a phase, as in `--nbckpt-<role>`: the barrier prefix's word for any wait. */
export function spanKind(names: ITimelineNames, phase: string): string {
  const word = isBarrierPhase(names, phase) ? names.barrier_prefix : phase;
  return word.replace(/[^a-z_]/g, '');
}

/** The CSS classes of a phase span: its kind, and whether it failed or is open. */
export function spanClasses(phase: IPhase, names: ITimelineNames): string[] {
  const classes = ['nbckpt-span', `nbckpt-span-${spanKind(names, phase.name)}`];
  if (phase.status !== names.statuses.done) {
    classes.push(`nbckpt-span-${phase.status}`);
  }
  return classes;
}

function ms(seconds: number): string {
  return `${Math.round(seconds * 1000)} ms`;
}

function list(processes: number[]): string {
  return processes.join(', ');
}

/** The first label of `labels` at most `width` pixels wide, or null. */
function fitting(labels: string[], width: number): string | null {
  return labels.find(label => label.length * CHAR + 6 <= width) ?? null;
}

/** Break `text` into at most `max` lines of `chars` characters, the last cut with '…'. */
export function wrapText(text: string, chars: number, max: number): string[] {
  const width = Math.max(chars, 8);
  const lines: string[] = [];
  let rest = text.trim();
  while (rest.length > 0 && lines.length < max) {
    if (rest.length <= width) {
      lines.push(rest);
      rest = '';
      break;
    }
    let cut = rest.lastIndexOf(' ', width);
    if (cut <= width / 3) {
      cut = width; // one long word: break inside it
    }
    lines.push(rest.slice(0, cut).trimEnd());
    rest = rest.slice(cut).trimStart();
  }
  if (rest.length > 0) {
    const last = lines[lines.length - 1];
    lines[lines.length - 1] = `${last.slice(0, Math.max(width - 1, 1))}…`;
  }
  return lines;
}

/**
 * Draw an operation's per-process timeline: one row per process, one span per phase
 * coloured by its role, barrier waits hatched and labelled with whom they waited for
 * (when the span is wide enough; always in the tooltip), failed spans outlined in red
 * with the error under the row, open spans dashed and growing to `now`, and the
 * moment a save committed marked across every row.
 *
 * @param op The merged journal, from `GET nbckpt/api/operations/<op>` or the widget.
 * @param names The protocol's names (`GET nbckpt/api/protocol`, or a widget trait).
 * @param width The width to draw at, in CSS pixels (text keeps its size).
 * @param options What time open spans reach.
 * @returns A self-contained SVG element.
 */
export function renderTimeline(
  op: ITimelineOperation,
  names: ITimelineNames,
  width = 600,
  options: ITimelineOptions = {}
): SVGSVGElement {
  const WIDTH = Math.max(Math.floor(width), 200);
  const view = op.view;
  // One row per process the view names: those counted, seen, or reported dead.
  const everyone = Object.keys(view.processes)
    .map(Number)
    .sort((a, b) => a - b);
  const byIndex = new Map<number, IProcess>(
    Object.values(op.processes).map(p => [p.process, p])
  );
  const running = op.status === names.statuses.running;
  const last = view.latest;
  const now = running ? (options.now ?? op.now) : undefined;
  // Before the journal's first line there is no start: the axis begins now, never at
  // the epoch (which drew 0 to about 1.8e12 ms).
  const t0 = op.start ?? last ?? op.time ?? now ?? 0;
  let tEnd = op.end ?? now ?? last;
  tEnd = Math.max(tEnd ?? t0, last ?? t0);
  const t1 = Math.max(tEnd, t0 + 1e-3);
  const plot = WIDTH - LABEL - RIGHT;
  const x = (t: number): number => LABEL + ((t - t0) / (t1 - t0)) * plot;
  const errorChars = Math.floor(plot / CHAR);
  const errors = new Map<number, string[]>();
  for (const p of everyone) {
    const why = view.processes[p]?.failure ?? null;
    if (why !== null) {
      const lines =
        options.errors === false
          ? []
          : wrapText(why, errorChars, MAX_ERROR_LINES);
      errors.set(p, lines);
    }
  }
  const rowTop = new Map<number, number>();
  let y = TOP;
  for (const p of everyone) {
    rowTop.set(p, y);
    y += ROW + GAP + (errors.get(p)?.length ?? 0) * LINE;
  }
  const rowsEnd = y;
  const height = rowsEnd + AXIS;
  const hatch = `nbckpt-hatch-${++drawn}`;
  const root = svg('svg', {
    class: 'nbckpt-timeline',
    width: WIDTH,
    height,
    viewBox: `0 0 ${WIDTH} ${height}`,
    preserveAspectRatio: 'xMinYMin meet',
    role: 'img',
    'data-op': op.op,
    'data-status': op.status
  });
  root.appendChild(
    titled(
      svg('desc', {}),
      `${op.kind} ${op.op}: ${op.status}, ${everyone.length} processes`
    )
  );
  const defs = svg('defs', {});
  const pattern = svg('pattern', {
    id: hatch,
    width: 6,
    height: 6,
    patternUnits: 'userSpaceOnUse',
    patternTransform: 'rotate(45)'
  });
  pattern.appendChild(
    svg('rect', { width: 6, height: 6, class: 'nbckpt-hatch-bg' })
  );
  pattern.appendChild(
    svg('line', { x1: 0, y1: 0, x2: 0, y2: 6, class: 'nbckpt-hatch-line' })
  );
  defs.appendChild(pattern);
  root.appendChild(defs);

  for (const p of everyone) {
    const proc = byIndex.get(p);
    const top = rowTop.get(p) ?? 0;
    const row = svg('g', {
      class: `nbckpt-timeline-row nbckpt-status-${(proc?.status ?? '').replace(/\W/g, '_')}`,
      'data-process': p
    });
    const label = svg('text', {
      x: 0,
      y: top + ROW * 0.7,
      class: 'nbckpt-timeline-label'
    });
    label.textContent = `p${p}`;
    row.appendChild(label);
    row.appendChild(
      svg('line', {
        x1: LABEL,
        x2: WIDTH - RIGHT,
        y1: top + ROW / 2,
        y2: top + ROW / 2,
        class: 'nbckpt-timeline-track'
      })
    );
    if (proc === undefined) {
      const none = svg('text', {
        x: LABEL + 4,
        y: top + ROW * 0.7,
        class: 'nbckpt-timeline-note'
      });
      none.textContent = 'no journal yet';
      row.appendChild(none);
    }
    const labels: SVGTextElement[] = [];
    for (const phase of proc?.phases ?? []) {
      const end = phase.end ?? t1;
      const left = x(phase.start);
      const w = Math.max(x(end) - left, 1.5);
      const rect = svg('rect', {
        x: left,
        y: top + 2,
        width: w,
        height: ROW - 4,
        rx: 2,
        class: spanClasses(phase, names).join(' '),
        'data-phase': phase.name,
        'data-status': phase.status
      });
      const offset = `+${ms(phase.start - t0)}`;
      const length =
        phase.end === null ? 'still open' : `${ms(end - phase.start)}`;
      let tip = `process ${p} ${phase.name}: at ${offset}, ${length} (${phase.status})`;
      if (isBarrierPhase(names, phase.name)) {
        // Inline style, because the theme's CSS fill would beat an attribute.
        rect.style.fill = `url(#${hatch})`;
        const wait = view.processes[p]?.waits[phase.name];
        rect.dataset.waitedFor = list(wait?.processes ?? []);
        if (wait !== undefined && wait.processes.length > 0) {
          tip += `; ${wait.label}`;
          const text = fitting([wait.label, wait.short], w);
          if (text !== null) {
            const t = svg('text', {
              x: left + 3,
              y: top + ROW * 0.68,
              class: 'nbckpt-barrier-label'
            });
            t.textContent = text;
            labels.push(t);
          }
        }
      }
      row.appendChild(titled(rect, tip));
    }
    // Labels after every span, so a later span never covers one.
    for (const t of labels) {
      row.appendChild(t);
    }
    const lines = errors.get(p);
    const drawing = view.processes[p];
    if (lines !== undefined && proc !== undefined && drawing !== undefined) {
      const at = drawing.failed_at ?? t1;
      row.appendChild(
        titled(
          svg('line', {
            x1: x(at),
            x2: x(at),
            y1: top,
            y2: top + ROW,
            class: 'nbckpt-failure-mark'
          }),
          `process ${p} at +${ms(at - t0)}: ${drawing.failure ?? ''}`
        )
      );
      const text = svg('text', {
        x: LABEL,
        y: top + ROW + 9,
        class: 'nbckpt-timeline-error'
      });
      lines.forEach((line, i) => {
        const span = svg('tspan', { x: LABEL, dy: i === 0 ? 0 : LINE });
        span.textContent = line;
        text.appendChild(span);
      });
      if (lines.length > 0) {
        row.appendChild(titled(text, `process ${p}: ${drawing.failure ?? ''}`));
      }
    }
    root.appendChild(row);
  }

  const committed = view.commit_time;
  if (committed !== null) {
    const cx = x(committed);
    const marker = svg('g', { class: 'nbckpt-commit' });
    marker.appendChild(
      svg('line', {
        x1: cx,
        x2: cx,
        y1: TOP - 3,
        y2: rowsEnd - GAP,
        class: 'nbckpt-commit-line'
      })
    );
    const word = names.statuses.committed;
    const anchor =
      cx + word.length * CHAR > WIDTH
        ? 'end'
        : cx - LABEL < 20
          ? 'start'
          : 'middle';
    const text = svg('text', {
      x: cx,
      y: TOP - 4,
      'text-anchor': anchor,
      class: 'nbckpt-commit-label'
    });
    text.textContent = word;
    marker.appendChild(text);
    root.appendChild(
      titled(
        marker,
        `${word} at +${ms(committed - t0)}: the step is complete from here on`
      )
    );
  }

  const axisY = rowsEnd + 10;
  for (const [t, anchor] of [
    [t0, 'start'],
    [t1, 'end']
  ] as const) {
    const tick = svg('text', {
      x: x(t),
      y: axisY,
      'text-anchor': anchor,
      class: 'nbckpt-timeline-axis'
    });
    tick.textContent =
      running && t === t1 && t > t0 ? `${ms(t - t0)} (now)` : ms(t - t0);
    root.appendChild(tick);
  }
  return root;
}

/**
 * The legend of a timeline: a swatch per role the operation shows (every phase kind
 * it has, barrier waits, failures, the commit marker).
 *
 * @param op The merged journal.
 * @param names The protocol's names.
 * @returns A `div.nbckpt-legend`.
 */
export function renderLegend(
  op: ITimelineOperation,
  names: ITimelineNames
): HTMLDivElement {
  const legend = document.createElement('div');
  legend.className = 'nbckpt-legend';
  const kinds = new Set<string>();
  for (const proc of Object.values(op.processes)) {
    for (const phase of proc.phases) {
      kinds.add(spanKind(names, phase.name));
    }
  }
  const failed = Object.values(op.view.processes).some(d => d.failure !== null);
  const barrier = spanKind(names, names.barrier_prefix);
  const order = [
    names.phase_names.snapshot,
    names.phase_names.read,
    names.phase_names.write,
    barrier,
    names.phase_names.finalize
  ];
  const items: [string, string][] = order
    .filter(kind => kinds.has(kind))
    .map(kind => [kind, kind === barrier ? `${barrier} wait` : kind]);
  for (const kind of kinds) {
    if (!order.includes(kind)) {
      items.push([kind, kind]);
    }
  }
  if (failed) {
    items.push([names.statuses.failed, names.statuses.failed]);
  }
  if (op.view.commit_time !== null) {
    items.push(['commit', names.statuses.committed]);
  }
  for (const [kind, label] of items) {
    const item = document.createElement('span');
    item.className = 'nbckpt-legend-item';
    const swatch = document.createElement('span');
    swatch.className = `nbckpt-swatch nbckpt-swatch-${kind.replace(/\W/g, '_')}`;
    item.append(swatch, label);
    legend.appendChild(item);
  }
  return legend;
}
