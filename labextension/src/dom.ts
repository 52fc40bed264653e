/**
 * The two DOM helpers the widget and the sidebar's summary share.
 */

/** An element with a class and a text (or a node) in it. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: unknown
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text instanceof Node) {
    node.append(text);
  } else if (text !== undefined && text !== null) {
    node.textContent = String(text);
  }
  return node;
}

/**
 * Text with a line-break opportunity after each `:` and `_`, so that long protocol
 * names (a barrier wait: prefix, colon, barrier name) wrap in a narrow notebook rather than widen it.
 */
export function breakable(text: string): DocumentFragment {
  const out = document.createDocumentFragment();
  for (const part of text.split(/(?<=[:_])/)) {
    out.append(part, document.createElement('wbr'));
  }
  return out;
}
