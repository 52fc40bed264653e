/**
 * The front end of `nbckpt.widgets.ProgressWidget`, an anywidget ES module.
 *
 * It draws what the Python side computed: the operation's per-process timeline (the
 * same component as the lab sidebar's, `../timeline.ts`), growing while the operation
 * runs, above one table row per process (`rows_from_view`) with its phase, bytes,
 * barrier chips and end state. Every protocol word it shows (phases, statuses,
 * barrier names) arrives in the synced traits; this module spells none of them.
 * Above 16 processes Python also sends `summary` (`nbckpt.views.aggregate`): the job
 * as a whole, drawn above the rows, which are then only those of the processes that
 * matter (the culprits, the missing, the slowest), as are the timeline's lanes; a
 * field below the summary sets `asked`, and Python adds that process's row and lane.
 * `jlpm build:widget` bundles it with the timeline into one self-contained file,
 * `nbckpt/widgets/static/progress.js` (anywidget loads a single module), and its style
 * (`style/widget.css`, with the shared palette and timeline rules) into
 * `nbckpt/widgets/static/progress.css`.
 */
import type { IColumn, IJobSummaryView, IRow } from '../../generated/nbckpt';
import { breakable, el } from '../dom';
import { processPicker, renderSummary } from '../summary';
import {
  ITimelineNames,
  ITimelineOperation,
  renderLegend,
  renderTimeline
} from '../timeline';

/** One barrier chip, and one process's row (`rows_from_view`), typed from Python. */
export type { IBarrierCell, IRow } from '../../generated/nbckpt';

/** The protocol names the widget gets from Python (`nbckpt.protocol.as_json()`). */
export type IWidgetNames = ITimelineNames;

/** The synced traits this module reads. */
export interface ITraits {
  op: string;
  title: string;
  status: string;
  /** The table's columns, chosen in Python for the operation's kind (`columns_of`). */
  columns: IColumn[];
  rows: IRow[];
  /** The job as a whole; `{}` for a job of a few processes. */
  summary: Partial<IJobSummaryView>;
  /** The merged journal plus `now`, the kernel's clock; `{}` when there is none. */
  timeline: Partial<ITimelineOperation>;
  protocol: Partial<IWidgetNames>;
  /** The process whose row and lane were asked for (a job of many), or null. */
  asked: number | null;
}

/** The part of anywidget's model this module uses. */
export interface IModel {
  get<K extends keyof ITraits>(key: K): ITraits[K];
  set<K extends keyof ITraits>(key: K, value: ITraits[K]): void;
  save_changes(): void;
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

/** What anywidget passes to `render`. */
export interface IRenderProps {
  model: IModel;
  el: HTMLElement;
}

/** Until Python sends `columns` (an older kernel): a save's table. */
const SAVE_COLUMNS: IColumn[] = [
  { key: 'process', label: 'process' },
  { key: 'phase', label: 'phase' },
  { key: 'bytes', label: 'written' },
  { key: 'barriers', label: 'barriers' },
  { key: 'end', label: 'finalize / commit' }
];

/** How often an open span grows while nothing new arrives. */
const TICK_MS = 500;
/** Open spans stop growing this long after the last update (a silent, dead run). */
const GROW_LIMIT_S = 60;

function bytesCell(r: IRow): HTMLElement {
  const bytes = el('td', 'nbckpt-w-bytes');
  if (r.show_bytes) {
    const box = el('div', 'nbckpt-w-bytes-box');
    if (r.show_bar !== false) {
      const bar = el('div', 'nbckpt-w-bar');
      // The bar takes the colour of the phase that moves its bytes (Python says which).
      const fillKind = r.fill_kind.replace(/\W/g, '_');
      const fill = el('div', `nbckpt-w-fill nbckpt-w-fill-${fillKind}`);
      fill.style.width = `${Math.round(100 * (r.fraction || 0))}%`;
      bar.append(fill);
      box.append(bar);
    }
    // A size never breaks between its number and its unit, only around the '/'.
    const size = r.bytes_text.replace(/(\d) (?=[A-Za-z])/g, '$1\u00a0');
    box.append(el('span', 'nbckpt-w-bytes-text', size));
    bytes.append(box);
  }
  return bytes;
}

/** One cell of a row, by the column's key. */
function cell(key: string, r: IRow): HTMLElement {
  switch (key) {
    case 'process':
      return el('td', 'nbckpt-w-proc', String(r.process));
    case 'phase': {
      const phase = el('td', 'nbckpt-w-phase');
      phase.append(breakable(r.phase));
      if (r.phase_note) {
        phase.append(el('div', 'nbckpt-w-note', r.phase_note));
      }
      return phase;
    }
    case 'bytes':
      return bytesCell(r);
    case 'barriers': {
      const chips = el('td', 'nbckpt-w-barriers');
      for (const b of r.barriers) {
        const chip = el('span', 'nbckpt-w-barrier');
        chip.append(breakable(b.text));
        chip.dataset.state = b.state;
        chip.dataset.name = b.name;
        chips.append(chip);
      }
      return chips;
    }
    default: {
      const end = el('td', 'nbckpt-w-end');
      end.append(
        el('span', 'nbckpt-w-status', r.status),
        el('span', 'nbckpt-w-when', breakable(r.end_text))
      );
      return end;
    }
  }
}

function drawRow(table: HTMLTableElement, r: IRow, columns: IColumn[]): void {
  const tr = el('tr', `nbckpt-w-row nbckpt-w-${r.status}`);
  tr.dataset.process = String(r.process);
  tr.dataset.status = r.status;
  for (const c of columns) {
    tr.append(cell(c.key, r));
  }
  table.append(tr);
  if (r.error) {
    const row = el('tr', 'nbckpt-w-error-row');
    const td = el('td', 'nbckpt-w-error', `process ${r.process}: ${r.error}`);
    td.colSpan = columns.length;
    row.append(td);
    table.append(row);
  }
}

/** The title line: what the operation is, and its status as a badge. */
function drawHead(model: IModel, head: HTMLElement): void {
  const status = model.get('status');
  head.replaceChildren(
    el('span', 'nbckpt-w-title', `${model.get('title')} `),
    el('span', `nbckpt-w-badge nbckpt-w-${status}`, status)
  );
}

/** The job as a whole (a job of many processes), or nothing. */
function drawSummary(model: IModel, box: HTMLElement): void {
  const summary = model.get('summary') || {};
  if (summary.headline === undefined) {
    box.replaceChildren();
    box.hidden = true;
    return;
  }
  box.hidden = false;
  const job = summary as IJobSummaryView;
  box.replaceChildren(
    ...renderSummary(job),
    processPicker(job.process_count, asked => {
      model.set('asked', asked);
      model.save_changes();
    })
  );
}

/** The table of rows, in a box that scrolls sideways only if nothing else fits. */
function drawTable(model: IModel, box: HTMLElement): void {
  const rows = model.get('rows') || [];
  const table = el('table', 'nbckpt-w-table');
  table.dataset.status = model.get('status');
  const columns = model.get('columns') || SAVE_COLUMNS;
  const head = el('tr');
  for (const c of columns) {
    head.append(el('th', '', c.label));
  }
  table.append(head);
  for (const r of rows) {
    drawRow(table, r, columns);
  }
  box.replaceChildren(table);
}

/** Whether the timeline trait holds a journal the renderer can draw. */
function drawable(
  timeline: Partial<ITimelineOperation>,
  names: Partial<IWidgetNames>
): [ITimelineOperation, ITimelineNames] | null {
  if (
    timeline.processes === undefined ||
    timeline.view === undefined ||
    timeline.op === undefined ||
    names.statuses === undefined ||
    names.phase_names === undefined ||
    names.barrier_prefix === undefined
  ) {
    return null;
  }
  return [timeline as ITimelineOperation, names as ITimelineNames];
}

/**
 * Draw the timeline into `box` at its width, open spans reaching `now` plus the time
 * that has passed here since the kernel sent it.
 */
function drawTimeline(model: IModel, box: HTMLElement, grownS: number): void {
  const found = drawable(
    model.get('timeline') || {},
    model.get('protocol') || {}
  );
  if (found === null) {
    box.replaceChildren();
    box.hidden = true;
    return;
  }
  const [op, names] = found;
  const now = op.now === undefined ? undefined : op.now + grownS;
  box.hidden = false;
  box.replaceChildren(
    renderTimeline(op, names, box.clientWidth || 600, { now, errors: false }),
    renderLegend(op, names)
  );
}

/** Render one view of the widget; redraw whenever a trait it shows changes. */
function render({ model, el: root }: IRenderProps): () => void {
  const frame = el('div', 'nbckpt-w');
  const head = el('div', 'nbckpt-w-head');
  const whole = el('div', 'nbckpt-summary');
  whole.hidden = true;
  const chart = el('div', 'nbckpt-w-timeline');
  const scroll = el('div', 'nbckpt-w-scroll');
  frame.append(head, whole, chart, scroll);
  root.replaceChildren(frame);

  let received = performance.now();
  let timer = 0;
  let width = 0;
  const grown = (): number =>
    Math.min((performance.now() - received) / 1000, GROW_LIMIT_S);
  const running = (): boolean => {
    const timeline = model.get('timeline') || {};
    const names = model.get('protocol') || {};
    return (
      names.statuses !== undefined &&
      timeline.status === names.statuses.running &&
      timeline.now !== undefined
    );
  };
  const tick = (): void => {
    if (!running() || grown() >= GROW_LIMIT_S) {
      window.clearInterval(timer);
      timer = 0;
      return;
    }
    drawTimeline(model, chart, grown());
  };
  const redrawTimeline = (): void => {
    received = performance.now();
    drawTimeline(model, chart, 0);
    frame.dataset.status = model.get('status');
    if (running() && timer === 0) {
      timer = window.setInterval(tick, TICK_MS);
    }
  };
  const redrawTable = (): void => {
    frame.dataset.op = model.get('op');
    frame.dataset.status = model.get('status');
    drawHead(model, head);
    drawSummary(model, whole);
    drawTable(model, scroll);
  };
  const events: [string, () => void][] = [
    ['change:rows', redrawTable],
    ['change:columns', redrawTable],
    ['change:summary', redrawTable],
    ['change:status', redrawTable],
    ['change:title', redrawTable],
    ['change:timeline', redrawTimeline],
    ['change:protocol', redrawTimeline]
  ];
  for (const [event, callback] of events) {
    model.on(event, callback);
  }
  // Draw again at the new width when the notebook (or the sidebar beside it) resizes.
  const resized = new ResizeObserver(() => {
    if (chart.clientWidth !== width) {
      width = chart.clientWidth;
      drawTimeline(model, chart, timer === 0 ? 0 : grown());
    }
  });
  resized.observe(chart);
  redrawTable();
  redrawTimeline();
  return () => {
    resized.disconnect();
    window.clearInterval(timer);
    for (const [event, callback] of events) {
      model.off(event, callback);
    }
  };
}

export default { render };
