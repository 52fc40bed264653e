import { IOperation, IPhase } from './model';
import { IProtocol, isBarrier, phaseKind } from './protocol';

const SVG_NS = 'http://www.w3.org/2000/svg';
const LABEL = 28;
const ROW = 20;
const GAP = 6;
const AXIS = 18;

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

/** The CSS classes of a phase span: its kind, and whether it failed or is open. */
export function spanClasses(phase: IPhase, protocol: IProtocol): string[] {
  const classes = [
    'nbckpt-span',
    `nbckpt-span-${phaseKind(protocol, phase.name)}`
  ];
  if (phase.status !== protocol.statuses.done) {
    classes.push(`nbckpt-span-${phase.status}`);
  }
  return classes;
}

function ms(seconds: number): string {
  return `${Math.round(seconds * 1000)} ms`;
}

/**
 * Draw an operation's per-process timeline: one row per process, one span per
 * phase, barrier waits hatched, failed spans outlined in red, open spans dashed.
 *
 * @param op The merged journal from `GET nbckpt/api/operations/<op>`.
 * @param protocol The protocol's names (`GET nbckpt/api/protocol`).
 * @param width The width to draw at, in CSS pixels (text keeps its size).
 * @returns A self-contained SVG element.
 */
export function renderTimeline(
  op: IOperation,
  protocol: IProtocol,
  width = 600
): SVGSVGElement {
  const WIDTH = Math.max(width, 160);
  const processes = Object.values(op.processes).sort(
    (a, b) => a.process - b.process
  );
  const t0 = op.start ?? op.time;
  const t1 = Math.max(op.end ?? op.time, t0 + 1e-3);
  const plot = WIDTH - LABEL - 8;
  const x = (t: number): number => LABEL + ((t - t0) / (t1 - t0)) * plot;
  const height = processes.length * (ROW + GAP) + AXIS;
  const root = svg('svg', {
    class: 'nbckpt-timeline',
    width: WIDTH,
    height,
    viewBox: `0 0 ${WIDTH} ${height}`,
    preserveAspectRatio: 'xMinYMin meet',
    role: 'img'
  });
  const defs = svg('defs', {});
  const pattern = svg('pattern', {
    id: `nbckpt-hatch-${op.op}`,
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

  processes.forEach((proc, i) => {
    const y = i * (ROW + GAP);
    const row = svg('g', {
      class: `nbckpt-timeline-row nbckpt-status-${proc.status}`,
      'data-process': proc.process
    });
    const label = svg('text', {
      x: 0,
      y: y + ROW * 0.7,
      class: 'nbckpt-timeline-label'
    });
    label.textContent = `p${proc.process}`;
    row.appendChild(label);
    row.appendChild(
      svg('line', {
        x1: LABEL,
        x2: WIDTH - 8,
        y1: y + ROW / 2,
        y2: y + ROW / 2,
        class: 'nbckpt-timeline-track'
      })
    );
    for (const phase of proc.phases) {
      const end = phase.end ?? t1;
      const rect = svg('rect', {
        x: x(phase.start),
        y: y + 2,
        width: Math.max(x(end) - x(phase.start), 1.5),
        height: ROW - 4,
        rx: 2,
        class: spanClasses(phase, protocol).join(' '),
        'data-phase': phase.name
      });
      if (isBarrier(protocol, phase.name)) {
        // Inline style, because the theme's CSS fill would beat an attribute.
        rect.style.fill = `url(#nbckpt-hatch-${op.op})`;
      }
      const title = svg('title', {});
      const offset = ms(phase.start - t0);
      const length = phase.end === null ? 'still open' : ms(end - phase.start);
      title.textContent = `process ${proc.process} ${phase.name}: at ${offset}, ${length} (${phase.status})`;
      rect.appendChild(title);
      row.appendChild(rect);
    }
    if (proc.error) {
      const title = svg('title', {});
      title.textContent = `process ${proc.process} failed: ${proc.error}`;
      row.appendChild(title);
    }
    root.appendChild(row);
  });

  const axisY = processes.length * (ROW + GAP) + 12;
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
    tick.textContent = ms(t - t0);
    root.appendChild(tick);
  }
  return root;
}
