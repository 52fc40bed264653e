import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  CheckpointsModel,
  ICheckpoints,
  IClusterRoot,
  IEntry,
  IOperation,
  IOperationSummary
} from './model';
import { IProtocol } from './protocol';
import { el } from './dom';
import { processPicker, renderSummary } from './summary';
import { renderLegend, renderTimeline } from './timeline';

/** Format a byte count the way people read it. */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

/** Format a wall time: the time of day if it is today, else a short date too. */
export function formatTime(seconds: number | null): string {
  if (seconds === null) {
    return '';
  }
  const date = new Date(seconds * 1000);
  const clock = date.toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit'
  });
  if (date.toDateString() === new Date().toDateString()) {
    return clock;
  }
  const day = date.toLocaleDateString([], { month: 'short', day: 'numeric' });
  return `${day} ${clock}`;
}

function badge(state: string): HTMLSpanElement {
  const node = el('span', `nbckpt-badge nbckpt-badge-${state}`);
  node.textContent = state.replace('_', ' ');
  return node;
}

/**
 * The "Checkpoints" sidebar: a root chooser (with the roots running clusters use and
 * those found below the server root), the root's steps with state badges, its
 * operations, and the per-process timeline of the selected operation.
 */
export class CheckpointsPanel extends Widget {
  constructor(model: CheckpointsModel) {
    super();
    this.model = model;
    this.addClass('nbckpt-sidebar');
    this.id = 'nbckpt-sidebar';

    const form = el('form', 'nbckpt-root-form');
    this._input = el('input', 'nbckpt-root-input jp-mod-styled');
    this._input.placeholder =
      'checkpoint root under the server root (relative or absolute), or s3://bucket/prefix';
    this._input.setAttribute('aria-label', 'Checkpoint root');
    const open = el(
      'button',
      'nbckpt-root-open jp-mod-styled jp-mod-accept',
      'Open'
    );
    open.type = 'submit';
    const refresh = el('button', 'nbckpt-refresh jp-mod-styled', 'Refresh');
    refresh.type = 'button';
    refresh.addEventListener('click', () => void this.model.refresh(true));
    form.append(this._input, open, refresh);
    form.addEventListener('submit', event => {
      event.preventDefault();
      void this.model.setRoot(this._input.value.trim());
    });

    this._roots = el('details', 'nbckpt-roots');
    const summary = el('summary', 'nbckpt-roots-summary', 'Roots');
    this._rootsList = el('ul', 'nbckpt-roots-list');
    this._rootsNote = el('div', 'nbckpt-roots-note');
    const rescan = el(
      'button',
      'nbckpt-roots-rescan jp-mod-styled',
      'Scan again'
    );
    rescan.type = 'button';
    rescan.title = 'Look again for checkpoint roots below the server root';
    rescan.addEventListener('click', () => void this.model.loadRoots());
    this._roots.append(summary, this._rootsList, this._rootsNote, rescan);
    this._roots.addEventListener('toggle', () => {
      if (this._roots.open && !this.model.scanning) {
        void this.model.loadRoots();
      }
    });

    this._status = el('div', 'nbckpt-status');
    this._steps = el('table', 'nbckpt-steps');
    this._ops = el('ul', 'nbckpt-ops');
    this._timeline = el('section', 'nbckpt-timeline-section');
    this.node.append(
      el('h2', 'nbckpt-title', 'Checkpoints'),
      form,
      this._roots,
      this._status,
      el('h3', 'nbckpt-heading', 'Steps'),
      this._steps,
      el('h3', 'nbckpt-heading', 'Operations'),
      this._ops,
      this._timeline
    );
    this.model.changed.connect(this._render, this);
    this.model.rootChanged.connect(this._onRootChanged, this);
    this._render();
  }

  readonly model: CheckpointsModel;

  /** Called each time the sidebar is shown (the plugin opens the default root). */
  whenShown: (() => void) | null = null;

  /** Show a root in the input box and load it. */
  async openRoot(root: string): Promise<void> {
    this._input.value = root;
    await this.model.setRoot(root);
  }

  /** Show or hide the list of roots (it loads when shown). */
  showRoots(open: boolean): void {
    this._roots.open = open;
  }

  /**
   * Load and draw one operation's timeline; of a job of many processes, with the
   * lanes of `process` too.
   */
  async showOperation(op: string, process?: number): Promise<void> {
    if (this._selected !== op) {
      this._shown = null;
      this._asked = undefined;
    }
    if (process !== undefined) {
      this._asked = process;
    }
    this._selected = op;
    this._highlight();
    // An answer for a root the user has left since is dropped, success or failure.
    const generation = this.model.generation;
    let data: IOperation;
    let protocol: IProtocol;
    try {
      [data, protocol] = await this.model.operation(op, this._asked);
    } catch (reason) {
      if (generation === this.model.generation && this._selected === op) {
        this._timeline.replaceChildren(
          el('div', 'nbckpt-error', `Cannot load ${op}: ${String(reason)}`)
        );
      }
      return;
    }
    if (generation !== this.model.generation || this._selected !== op) {
      return;
    }
    this._drawTimeline(data, protocol);
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    if (this._shown) {
      this._drawTimeline(...this._shown);
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.model.visible = true;
    this.whenShown?.();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this.model.visible = false;
  }

  dispose(): void {
    this.model.changed.disconnect(this._render, this);
    this.model.rootChanged.disconnect(this._onRootChanged, this);
    super.dispose();
  }

  /** Another root: nothing of the previous one stays on screen. */
  private _onRootChanged(_: CheckpointsModel, root: string): void {
    this._input.value = root;
    this._selected = null;
    this._shown = null;
    this._stale = false;
    this._timeline.replaceChildren();
    this._steps.replaceChildren();
    this._ops.replaceChildren();
    this._renderRoots();
  }

  private _render(): void {
    const model = this.model;
    this._renderRoots();
    if (model.error) {
      this._status.className = 'nbckpt-status nbckpt-error';
      this._status.textContent = model.error;
    } else if (model.checkpoints) {
      const c = model.checkpoints;
      this._status.className = 'nbckpt-status';
      const saving = model.inFlight.length;
      this._status.textContent =
        `${c.entries.length} ${c.entries.length === 1 ? 'entry' : 'entries'} in ${c.root}` +
        (saving ? `, ${saving} saving` : '') +
        ` (updated ${new Date(c.time * 1000).toLocaleTimeString()})`;
    } else {
      this._status.className = 'nbckpt-status';
      this._status.textContent =
        model.root === null
          ? 'Choose a checkpoint root above, or type one.'
          : 'Loading…';
    }
    this._renderSteps(model.checkpoints);
    this._renderOps(model.operations?.operations ?? []);
    // Keep a running operation's timeline live.
    const selected = this._selected;
    if (
      selected &&
      model.operations?.operations.some(
        o => o.op === selected && (model.isRunning(o.status) || this._stale)
      )
    ) {
      void this.showOperation(selected);
    }
  }

  private _renderSteps(checkpoints: ICheckpoints | null): void {
    const entries: IEntry[] = checkpoints?.entries ?? [];
    // Every state the server's inventory knows, in its words.
    const states = (checkpoints?.states ?? []).map(s => s.replace('_', ' '));
    const head = el('tr', 'nbckpt-steps-head');
    for (const [label, title] of [
      ['Step', 'step number'],
      ['State', states.join(', ') || "the entry's state"],
      ['Size', 'bytes on disk'],
      ['Time', 'finalized at (or last modified)'],
      ['Procs', 'how many processes saved it']
    ]) {
      const th = el('th', '', label);
      th.title = title;
      head.appendChild(th);
    }
    const rows: HTMLTableRowElement[] = [head];
    for (const entry of entries) {
      const row = el('tr', `nbckpt-step nbckpt-step-${entry.state}`);
      row.dataset.step = String(entry.step);
      row.dataset.path = entry.path;
      row.title = `${entry.path}: ${entry.reason}`;
      const state = el('td', '');
      state.appendChild(badge(entry.state));
      const time = el('td', 'nbckpt-time', formatTime(entry.time));
      time.title = new Date(entry.time * 1000).toLocaleString();
      const number = el('td', 'nbckpt-step-number', String(entry.step));
      if (entry.format_label) {
        // Another program's steps (Orbax's) are listed and restorable, never
        // written or cleaned: the server names the writer.
        number.appendChild(
          el('span', 'nbckpt-format', ` ${entry.format_label}`)
        );
      }
      row.append(
        number,
        state,
        el(
          'td',
          'nbckpt-size',
          entry.bytes === null ? '—' : formatBytes(entry.bytes)
        ),
        time,
        el('td', 'nbckpt-procs', String(entry.process_count ?? ''))
      );
      const op = entry.op;
      if (op) {
        row.classList.add('nbckpt-clickable');
        row.addEventListener('click', () => void this.showOperation(op));
      }
      rows.push(row);
    }
    if (entries.length === 0) {
      const row = el('tr', 'nbckpt-empty');
      const cell = el('td', '', 'No checkpoints here.');
      cell.colSpan = 5;
      row.appendChild(cell);
      rows.push(row);
    }
    this._steps.replaceChildren(...rows);
  }

  private _renderOps(ops: IOperationSummary[]): void {
    const items = ops.map(op => {
      const item = el('li', 'nbckpt-op nbckpt-clickable');
      item.dataset.op = op.op;
      item.title = op.op;
      item.append(
        badge(op.status),
        el('span', 'nbckpt-op-kind', op.label),
        el('span', 'nbckpt-op-time', formatTime(op.start))
      );
      item.addEventListener('click', () => void this.showOperation(op.op));
      return item;
    });
    if (items.length === 0) {
      items.push(el('li', 'nbckpt-empty', 'No operations journaled.'));
    }
    this._ops.replaceChildren(...items);
    this._highlight();
  }

  /** The running clusters' roots (with what runs there) and the roots found on disk. */
  private _renderRoots(): void {
    const model = this.model;
    const clusters: IClusterRoot[] =
      model.activity?.clusters ?? model.roots?.clusters ?? [];
    const shown = model.checkpoints?.root ?? model.root;
    const items: HTMLLIElement[] = [];
    const listed = new Set<string>();
    for (const cluster of [...clusters].reverse()) {
      listed.add(cluster.root);
      const item = this._rootItem(cluster.root, cluster.openable, shown);
      item.classList.add('nbckpt-root-cluster');
      item.title =
        `${cluster.path}: used by a running cluster (kernel pid ${cluster.pid})` +
        (cluster.reason ? `; ${cluster.reason}` : '');
      const tags = el('span', 'nbckpt-root-tags');
      tags.append(el('span', 'nbckpt-root-tag', 'cluster'));
      const statuses = model.protocol?.statuses;
      if (cluster.in_flight.length) {
        tags.append(
          el(
            'span',
            `nbckpt-badge nbckpt-badge-${statuses?.running} nbckpt-root-in-flight`,
            `${cluster.in_flight.length} in flight`
          )
        );
      }
      if (cluster.failed.length) {
        tags.append(
          el(
            'span',
            `nbckpt-badge nbckpt-badge-${statuses?.failed} nbckpt-root-failed`,
            `${cluster.failed.length} failed`
          )
        );
      }
      if (!cluster.openable) {
        tags.append(
          el('span', 'nbckpt-root-reason', cluster.reason ?? 'not readable')
        );
      }
      item.append(tags);
      items.push(item);
    }
    for (const found of model.roots?.found ?? []) {
      if (!listed.has(found.root)) {
        const item = this._rootItem(found.root, true, shown);
        item.classList.add('nbckpt-root-found');
        item.title = found.path;
        items.push(item);
      }
    }
    if (items.length === 0 && model.roots !== null) {
      items.push(
        el(
          'li',
          'nbckpt-empty',
          'No running cluster uses a root, and none was found below the server root.'
        )
      );
    }
    this._rootsList.replaceChildren(...items);
    const count = items.filter(i => i.dataset.root !== undefined).length;
    this._roots.querySelector('summary')!.textContent = count
      ? `Roots (${count})`
      : 'Roots';
    let note = '';
    if (model.scanning) {
      note = 'Looking for roots…';
    } else if (model.rootsError) {
      note = model.rootsError;
    } else if (model.roots?.truncated) {
      note =
        'The search stopped at its depth or time limit: type a deeper root.';
    }
    this._rootsNote.textContent = note;
    this._rootsNote.className =
      'nbckpt-roots-note' + (model.rootsError ? ' nbckpt-error' : '');
  }

  private _rootItem(
    root: string,
    openable: boolean,
    shown: string | null
  ): HTMLLIElement {
    const item = el('li', 'nbckpt-root');
    item.dataset.root = root;
    item.append(
      el('span', 'nbckpt-root-path', root === '.' ? '. (server root)' : root)
    );
    if (root === shown) {
      item.classList.add('nbckpt-selected');
    }
    if (openable) {
      item.classList.add('nbckpt-clickable');
      item.addEventListener('click', () => {
        this._roots.open = false;
        void this.openRoot(root);
      });
    } else {
      item.classList.add('nbckpt-root-disabled');
    }
    return item;
  }

  private _highlight(): void {
    for (const item of Array.from(this._ops.children)) {
      const node = item as HTMLElement;
      node.classList.toggle(
        'nbckpt-selected',
        node.dataset.op === this._selected
      );
    }
  }

  private _drawTimeline(op: IOperation, protocol: IProtocol): void {
    this._shown = [op, protocol];
    this._stale = op.status === protocol.statuses.running;
    const title = el('div', 'nbckpt-timeline-title');
    title.append(badge(op.status), el('span', 'nbckpt-timeline-op', op.label));
    // The failures are listed below the drawing, in the server's words, with the
    // processes that left no journal.
    const legend = renderLegend(op, protocol);
    const errors = el('ul', 'nbckpt-timeline-errors');
    for (const proc of Object.values(op.processes)) {
      const failure = op.view.processes[proc.process]?.failure;
      if (failure) {
        errors.appendChild(
          el('li', 'nbckpt-error', `p${proc.process}: ${failure}`)
        );
      }
    }
    const seen = Object.keys(op.processes).length;
    // Of a job of many processes only some are sent: the summary speaks for the rest.
    const missing =
      op.summary === null && seen < op.process_count
        ? el(
            'div',
            'nbckpt-error',
            `${op.process_count - seen} of ${op.process_count} processes left no journal`
          )
        : el('div', '');
    const whole = el('div', 'nbckpt-summary');
    if (op.summary === null) {
      whole.hidden = true;
    } else {
      whole.append(
        ...renderSummary(op.summary),
        processPicker(
          op.process_count,
          asked => void this.showOperation(op.op, asked)
        )
      );
    }
    // The id is what %ckpt_show and %ckpt_timeline take: said as such, not bare.
    const id = el('div', 'nbckpt-timeline-id', `op id ${op.op}`);
    id.title = 'the id %ckpt_show and %ckpt_timeline take';
    this._timeline.replaceChildren(
      el('h3', 'nbckpt-heading', 'Timeline'),
      title,
      id,
      whole,
      renderTimeline(
        op,
        protocol,
        this._timeline.clientWidth || this.node.clientWidth - 16,
        { errors: false }
      ),
      legend,
      missing,
      errors
    );
  }

  private _input: HTMLInputElement;
  private _roots: HTMLDetailsElement;
  private _rootsList: HTMLUListElement;
  private _rootsNote: HTMLDivElement;
  private _status: HTMLDivElement;
  private _steps: HTMLTableElement;
  private _ops: HTMLUListElement;
  private _timeline: HTMLElement;
  private _selected: string | null = null;
  private _stale = false;
  private _shown: [IOperation, IProtocol] | null = null;
  /** The process whose lanes were asked for, in the selected operation. */
  private _asked: number | undefined = undefined;
}
