/**
 * The front end of `nbckpt.widgets.ProgressWidget`, an anywidget ES module.
 *
 * It draws what the Python side computed (`rows_from_view`): one table row per
 * process, with its phase, bytes, barrier chips and end state. Every protocol word it
 * shows (phases, statuses, barrier names) arrives in the synced traits; this module
 * spells none of them. It is built on its own (`jlpm build:widget`) into
 * `nbckpt/widgets/static/progress.js`, which the widget loads as its `_esm`.
 */

/** One barrier chip of a row. */
export interface IBarrierCell {
  name: string;
  state: string;
  text: string;
  waiting_for: number[];
  arrived_ms: number | null;
}

/** One process's row, as `nbckpt.widgets.progress.rows_from_view` builds it. */
export interface IRow {
  process: number;
  phase: string;
  status: string;
  bytes_written: number;
  bytes_total: number;
  fraction: number;
  show_bytes: boolean;
  bytes_text: string;
  barriers: IBarrierCell[];
  end_text: string;
  error: string | null;
  error_phase: string | null;
}

/** The synced traits this module reads. */
export interface ITraits {
  op: string;
  title: string;
  status: string;
  rows: IRow[];
}

/** The part of anywidget's model this module uses. */
export interface IModel {
  get<K extends keyof ITraits>(key: K): ITraits[K];
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

/** What anywidget passes to `render`. */
export interface IRenderProps {
  model: IModel;
  el: HTMLElement;
}

const HEADERS = [
  'process',
  'phase',
  'written',
  'barriers',
  'finalize / commit'
];

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: unknown
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined && text !== null) {
    node.textContent = String(text);
  }
  return node;
}

function drawRow(table: HTMLTableElement, r: IRow): void {
  const tr = el('tr', `nbckpt-w-row nbckpt-w-${r.status}`);
  tr.dataset.process = String(r.process);
  tr.dataset.status = r.status;
  tr.append(el('td', 'nbckpt-w-proc', String(r.process)));
  tr.append(el('td', 'nbckpt-w-phase', r.phase));
  const bytes = el('td', 'nbckpt-w-bytes');
  const bar = el('div', 'nbckpt-w-bar');
  const fill = el('div', 'nbckpt-w-fill');
  fill.style.width = `${Math.round(100 * (r.fraction || 0))}%`;
  bar.append(fill);
  if (r.show_bytes) {
    bytes.append(bar, el('span', 'nbckpt-w-bytes-text', r.bytes_text));
  }
  tr.append(bytes);
  const chips = el('td', 'nbckpt-w-barriers');
  for (const b of r.barriers) {
    const chip = el('span', 'nbckpt-w-barrier', b.text);
    chip.dataset.state = b.state;
    chip.dataset.name = b.name;
    chips.append(chip);
  }
  tr.append(chips);
  const end = el('td', 'nbckpt-w-end');
  end.append(
    el('span', 'nbckpt-w-status', r.status),
    el('span', 'nbckpt-w-when', r.end_text)
  );
  tr.append(end);
  table.append(tr);
  if (r.error) {
    const row = el('tr', 'nbckpt-w-error-row');
    const td = el('td', 'nbckpt-w-error', `process ${r.process}: ${r.error}`);
    td.colSpan = HEADERS.length;
    row.append(td);
    table.append(row);
  }
}

/** Draw the whole table from the model's current traits into `root`. */
export function draw(model: IModel, root: HTMLElement): void {
  const rows = model.get('rows') || [];
  const status = model.get('status');
  const table = el('table', 'nbckpt-w');
  table.dataset.status = status;
  const caption = el('caption', 'nbckpt-w-title');
  caption.append(el('span', '', `${model.get('title')} `));
  caption.append(el('span', `nbckpt-w-badge nbckpt-w-${status}`, status));
  table.append(caption);
  const head = el('tr');
  for (const h of HEADERS) {
    head.append(el('th', '', h));
  }
  table.append(head);
  for (const r of rows) {
    drawRow(table, r);
  }
  root.replaceChildren(table);
}

/** Render one view of the widget; redraw whenever a trait it shows changes. */
function render({ model, el: root }: IRenderProps): () => void {
  const redraw = (): void => draw(model, root);
  const events = ['change:rows', 'change:status', 'change:title'];
  for (const event of events) {
    model.on(event, redraw);
  }
  redraw();
  return () => {
    for (const event of events) {
      model.off(event, redraw);
    }
  };
}

export default { render };
