import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  CheckpointsModel,
  IEntry,
  IOperation,
  IOperationSummary
} from './model';
import { IProtocol, phaseKind } from './protocol';
import { renderTimeline } from './timeline';

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

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function badge(state: string): HTMLSpanElement {
  const node = el('span', `nbckpt-badge nbckpt-badge-${state}`);
  node.textContent = state.replace('_', ' ');
  return node;
}

/**
 * The "Checkpoints" sidebar: a root chooser, the root's steps with state badges, its
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
      'checkpoint root, relative to the server root, or s3://bucket/prefix';
    this._input.setAttribute('aria-label', 'Checkpoint root');
    const open = el(
      'button',
      'nbckpt-root-open jp-mod-styled jp-mod-accept',
      'Open'
    );
    open.type = 'submit';
    const refresh = el('button', 'nbckpt-refresh jp-mod-styled', 'Refresh');
    refresh.type = 'button';
    refresh.addEventListener('click', () => void this.model.refresh());
    form.append(this._input, open, refresh);
    form.addEventListener('submit', event => {
      event.preventDefault();
      void this.model.setRoot(this._input.value.trim());
    });

    this._status = el('div', 'nbckpt-status');
    this._steps = el('table', 'nbckpt-steps');
    this._ops = el('ul', 'nbckpt-ops');
    this._timeline = el('section', 'nbckpt-timeline-section');
    this.node.append(
      el('h2', 'nbckpt-title', 'Checkpoints'),
      form,
      this._status,
      el('h3', 'nbckpt-heading', 'Steps'),
      this._steps,
      el('h3', 'nbckpt-heading', 'Operations'),
      this._ops,
      this._timeline
    );
    this.model.changed.connect(this._render, this);
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

  /** Load and draw one operation's timeline. */
  async showOperation(op: string): Promise<void> {
    if (this._selected !== op) {
      this._shown = null;
    }
    this._selected = op;
    this._highlight();
    let data: IOperation;
    let protocol: IProtocol;
    try {
      [data, protocol] = await this.model.operation(op);
    } catch (reason) {
      this._timeline.replaceChildren(
        el('div', 'nbckpt-error', `Cannot load ${op}: ${String(reason)}`)
      );
      return;
    }
    if (this._selected !== op) {
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
    this.whenShown?.();
  }

  dispose(): void {
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const model = this.model;
    if (model.root !== null && this._input.value === '' && model.root !== '') {
      this._input.value = model.root;
    }
    if (model.error) {
      this._status.className = 'nbckpt-status nbckpt-error';
      this._status.textContent = model.error;
    } else if (model.checkpoints) {
      const c = model.checkpoints;
      this._status.className = 'nbckpt-status';
      const saving = model.inFlight.length;
      this._status.textContent =
        `${c.entries.length} entries in ${c.root}` +
        (saving ? `, ${saving} saving` : '') +
        ` (updated ${new Date(c.time * 1000).toLocaleTimeString()})`;
    } else {
      this._status.className = 'nbckpt-status';
      this._status.textContent =
        model.root === null ? 'Choose a checkpoint root.' : 'Loading…';
    }
    this._renderSteps(model.checkpoints?.entries ?? []);
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

  private _renderSteps(entries: IEntry[]): void {
    const head = el('tr', 'nbckpt-steps-head');
    for (const [label, title] of [
      ['Step', 'step number'],
      ['State', 'complete, in progress, abandoned or corrupt'],
      ['Size', 'bytes on disk'],
      ['Time', 'finalized at (or last modified)'],
      ['N', 'number of processes of the save']
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
      if (entry.format === 'orbax') {
        // Orbax's steps are listed and restorable, never written or cleaned.
        number.appendChild(el('span', 'nbckpt-format', ' Orbax'));
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
        el('span', 'nbckpt-op-kind', `${op.kind} ${op.step ?? ''}`),
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
    const running = protocol.statuses.running;
    this._stale = op.status === running;
    const title = el('div', 'nbckpt-timeline-title');
    title.append(
      badge(op.status),
      el('span', 'nbckpt-timeline-op', `${op.kind} of step ${op.step ?? '?'}`)
    );
    const legend = el('div', 'nbckpt-legend');
    const phases = protocol.phase_names;
    const barrier = phaseKind(protocol, protocol.barrier_prefix);
    for (const [kind, label] of [
      [phases.snapshot, phases.snapshot],
      [phases.write, phases.write],
      [barrier, `${barrier} wait`],
      [phases.finalize, phases.finalize],
      [protocol.statuses.failed, protocol.statuses.failed]
    ]) {
      const item = el('span', 'nbckpt-legend-item');
      item.append(el('span', `nbckpt-swatch nbckpt-swatch-${kind}`), label);
      legend.appendChild(item);
    }
    const errors = el('ul', 'nbckpt-timeline-errors');
    for (const proc of Object.values(op.processes)) {
      if (proc.error) {
        errors.appendChild(
          el('li', 'nbckpt-error', `p${proc.process}: ${proc.error}`)
        );
      } else if (proc.status === running && op.status !== running) {
        // The others finished or gave up, this one never recorded an outcome.
        errors.appendChild(
          el(
            'li',
            'nbckpt-error',
            `p${proc.process}: recorded no outcome (the process died?)`
          )
        );
      }
    }
    const seen = Object.keys(op.processes).length;
    const missing =
      seen < op.process_count
        ? el(
            'div',
            'nbckpt-error',
            `${op.process_count - seen} of ${op.process_count} processes left no journal`
          )
        : el('div', '');
    this._timeline.replaceChildren(
      el('h3', 'nbckpt-heading', 'Timeline'),
      title,
      el('div', 'nbckpt-timeline-id', op.op),
      renderTimeline(
        op,
        protocol,
        this._timeline.clientWidth || this.node.clientWidth - 16
      ),
      legend,
      missing,
      errors
    );
  }

  private _input: HTMLInputElement;
  private _status: HTMLDivElement;
  private _steps: HTMLTableElement;
  private _ops: HTMLUListElement;
  private _timeline: HTMLElement;
  private _selected: string | null = null;
  private _stale = false;
  private _shown: [IOperation, IProtocol] | null = null;
}
