"""The widget's front end: a small ES module and its CSS (anywidget loads both)."""

ESM = r"""
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function draw(model, root) {
  const rows = model.get("rows") || [];
  const status = model.get("status") || "running";
  const table = el("table", "nbckpt-w");
  table.dataset.status = status;
  const cap = el("caption", "nbckpt-w-title");
  cap.append(el("span", "", model.get("title") + " "));
  const badge = el("span", "nbckpt-w-badge nbckpt-w-" + status, status);
  cap.append(badge);
  table.append(cap);
  const head = el("tr");
  for (const h of ["process", "phase", "written", "barriers", "finalize / commit"]) {
    head.append(el("th", "", h));
  }
  table.append(head);
  for (const r of rows) {
    const tr = el("tr", "nbckpt-w-row nbckpt-w-" + r.status);
    tr.dataset.process = String(r.process);
    tr.dataset.status = r.status;
    tr.append(el("td", "nbckpt-w-proc", String(r.process)));
    tr.append(el("td", "nbckpt-w-phase", r.phase));
    const bytes = el("td", "nbckpt-w-bytes");
    const bar = el("div", "nbckpt-w-bar");
    const fill = el("div", "nbckpt-w-fill");
    fill.style.width = Math.round(100 * (r.fraction || 0)) + "%";
    bar.append(fill);
    if (r.show_bytes) bytes.append(bar, el("span", "nbckpt-w-bytes-text", r.bytes_text));
    tr.append(bytes);
    const bars = el("td", "nbckpt-w-barriers");
    for (const b of r.barriers) {
      const chip = el("span", "nbckpt-w-barrier", b.text);
      chip.dataset.state = b.state;
      chip.dataset.name = b.name;
      bars.append(chip);
    }
    tr.append(bars);
    const end = el("td", "nbckpt-w-end");
    end.append(el("span", "nbckpt-w-status", r.status), el("span", "nbckpt-w-when", r.end_text));
    tr.append(end);
    table.append(tr);
    if (r.error) {
      const er = el("tr", "nbckpt-w-error-row");
      const td = el("td", "nbckpt-w-error", "process " + r.process + ": " + r.error);
      td.colSpan = 5;
      er.append(td);
      table.append(er);
    }
  }
  root.replaceChildren(table);
}

export default {
  render({ model, el: root }) {
    const redraw = () => draw(model, root);
    model.on("change:rows", redraw);
    model.on("change:status", redraw);
    model.on("change:title", redraw);
    redraw();
  },
};
"""

CSS = """
.nbckpt-w { border-collapse: collapse; font-size: 12px; font-family: var(--jp-ui-font-family); }
.nbckpt-w caption { text-align: left; font-weight: 600; padding: 2px 0 4px; }
.nbckpt-w th { text-align: left; font-weight: 500; color: #666; padding: 1px 8px 1px 0; }
.nbckpt-w td { padding: 2px 8px 2px 0; vertical-align: middle; white-space: nowrap; }
.nbckpt-w-badge { border-radius: 3px; padding: 0 5px; color: white; background: #777; }
.nbckpt-w-badge.nbckpt-w-committed, .nbckpt-w-badge.nbckpt-w-restored { background: #2e7d32; }
.nbckpt-w-badge.nbckpt-w-failed { background: #c62828; }
.nbckpt-w-badge.nbckpt-w-running { background: #1565c0; }
.nbckpt-w-bar { display: inline-block; width: 140px; height: 9px; background: #e0e0e0;
  border-radius: 2px; margin-right: 6px; vertical-align: middle; overflow: hidden; }
.nbckpt-w-fill { height: 100%; background: #1e88e5; transition: width 0.2s; }
.nbckpt-w-committed .nbckpt-w-fill { background: #43a047; }
.nbckpt-w-failed .nbckpt-w-fill { background: #e53935; }
.nbckpt-w td.nbckpt-w-barriers { white-space: normal; max-width: 420px; }
.nbckpt-w-barrier { display: inline-block; margin: 0 4px 2px 0; padding: 0 4px;
  border-radius: 3px; background: #eceff1; white-space: nowrap; }
.nbckpt-w-barrier[data-state="waiting"] { background: #fff3e0; color: #e65100; }
.nbckpt-w-status { font-weight: 600; margin-right: 6px; }
.nbckpt-w-committed .nbckpt-w-status, .nbckpt-w-restored .nbckpt-w-status { color: #2e7d32; }
.nbckpt-w-failed .nbckpt-w-status { color: #c62828; }
.nbckpt-w-error { color: #c62828; white-space: pre-wrap; padding-left: 16px; }
"""
