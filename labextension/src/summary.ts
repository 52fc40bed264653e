/**
 * The job as a whole, as the widget and the sidebar draw it above their few rows or
 * lanes: the headline (the failure first, when there is one), how many processes are
 * in each phase, and each barrier's arrivals as log-scaled bars with who came last or
 * has not come. Every number and word comes from Python (`nbckpt.views.aggregate`).
 */
import type { IBarrierSummary, IJobSummaryView } from '../generated/nbckpt';
import { breakable, el } from './dom';

const SVG = 'http://www.w3.org/2000/svg';

/** A barrier's arrivals per slice of time, as bars (the counts come from Python). */
function histogram(b: IBarrierSummary): SVGSVGElement {
  const width = 120;
  const height = 18;
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'nbckpt-summary-hist');
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  const most = Math.max(1, ...b.histogram);
  const step = width / Math.max(1, b.histogram.length);
  b.histogram.forEach((count, i) => {
    if (count === 0) {
      return;
    }
    // Log-scaled, at least 3 px: one straggler among a thousand must show.
    const h = Math.max(
      3,
      Math.round((height * Math.log1p(count)) / Math.log1p(most))
    );
    const bar = document.createElementNS(SVG, 'rect');
    bar.setAttribute('x', String(i * step));
    bar.setAttribute('y', String(height - h));
    bar.setAttribute('width', String(Math.max(1, step - 1)));
    bar.setAttribute('height', String(h));
    svg.append(bar);
  });
  const title = document.createElementNS(SVG, 'title');
  title.textContent = `${b.name}: arrivals over ${Math.round(b.last_ms)} ms`;
  svg.append(title);
  return svg;
}

function ms(value: number): string {
  return `${Math.round(value).toLocaleString('en-US')}\u00a0ms`;
}

/** One barrier across the job: its spread, and who came last or has not come. */
function drawSpread(b: IBarrierSummary): HTMLElement {
  const line = el('div', 'nbckpt-summary-spread');
  line.dataset.name = b.name;
  line.append(
    el('span', 'nbckpt-summary-spread-name', breakable(b.name)),
    histogram(b)
  );
  const parts = [
    `${b.arrived.toLocaleString('en-US')} arrived, ${b.released.toLocaleString('en-US')} released`,
    `over ${ms(b.last_ms)} (median +${ms(b.median_ms)}, 90% +${ms(b.p90_ms)})`
  ];
  if (b.missing_count > 0) {
    const more = b.missing_count - b.missing.length;
    parts.push(
      `waiting for ${b.missing.join(', ')}${more > 0 ? ` and ${more.toLocaleString('en-US')} more` : ''}`
    );
  } else if (b.slowest.length > 0) {
    const last = b.slowest.slice(0, 3).map(a => `${a.process} (+${ms(a.ms)})`);
    parts.push(`last: ${last.join(', ')}`);
  }
  line.append(el('span', 'nbckpt-summary-spread-text', parts.join('; ')));
  return line;
}

/** The summary's elements, to put in a box of the caller's. */
export function renderSummary(summary: IJobSummaryView): HTMLElement[] {
  const headline = el('div', 'nbckpt-summary-headline', summary.headline);
  headline.dataset.failed = String(Boolean(summary.failure));
  const phases = el('div', 'nbckpt-summary-phases');
  for (const p of summary.phases) {
    const chip = el('span', 'nbckpt-summary-phase');
    chip.append(breakable(p.phase), ` ${p.count.toLocaleString('en-US')}`);
    phases.append(chip);
  }
  const spreads = summary.barriers.map(drawSpread);
  const total = summary.process_count.toLocaleString('en-US');
  const note = el(
    'div',
    'nbckpt-summary-note',
    `shown below: ${summary.notable.length} of ${total} processes (the culprits, the missing and the slowest)`
  );
  return [headline, phases, ...spreads, note];
}

/**
 * A field that asks for one more process's rows and lanes, below a summary. It only
 * says which process: what that process's rows and lanes hold is computed in Python.
 */
export function processPicker(
  processCount: number,
  ask: (process: number) => void
): HTMLFormElement {
  const form = el('form', 'nbckpt-process-picker');
  const input = el('input', 'nbckpt-process-input');
  input.type = 'number';
  input.min = '0';
  input.max = String(processCount - 1);
  input.placeholder = 'process';
  input.title = "Add this process's lanes to the timeline";
  const button = el('button', 'nbckpt-process-open', 'Show its lanes');
  button.type = 'submit';
  form.append(input, button);
  form.addEventListener('submit', event => {
    event.preventDefault();
    const asked = Number(input.value);
    if (input.value !== '' && Number.isInteger(asked)) {
      ask(asked);
    }
  });
  return form;
}
