// Small SVG charts drawn by hand: no library, no inline style (attributes and classes only).
const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 600;
const HEIGHT = 180;
const PAD = { left: 48, right: 8, top: 12, bottom: 24 };

function node(tag, attrs = {}, text) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) element.setAttribute(name, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

function frame(label, max, unit) {
  const svg = node("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": label, class: "chart" });
  svg.append(node("title", {}, label));
  const bottom = HEIGHT - PAD.bottom;
  svg.append(node("line", { x1: PAD.left, y1: bottom, x2: WIDTH - PAD.right, y2: bottom, class: "axis" }));
  svg.append(node("line", { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: bottom, class: "axis" }));
  svg.append(node("text", { x: PAD.left - 4, y: PAD.top + 4, class: "tick end" }, `${formatTick(max)}${unit}`));
  svg.append(node("text", { x: PAD.left - 4, y: bottom, class: "tick end" }, "0"));
  svg.append(node("text", { x: PAD.left, y: HEIGHT - 6, class: "tick" }, "−60 min"));
  svg.append(node("text", { x: WIDTH - PAD.right, y: HEIGHT - 6, class: "tick end" }, "now"));
  return svg;
}

function formatTick(value) {
  return value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
}

function x(index, count) {
  return PAD.left + ((WIDTH - PAD.left - PAD.right) * index) / Math.max(1, count);
}

function y(value, max) {
  const bottom = HEIGHT - PAD.bottom;
  return bottom - ((bottom - PAD.top) * value) / (max || 1);
}

/** One bar per point (``values``: numbers), labelled for screen readers by ``label``. */
export function barChart(label, values, unit = "") {
  const max = Math.max(1, ...values);
  const svg = frame(label, max, unit);
  const width = Math.max(1, (WIDTH - PAD.left - PAD.right) / Math.max(1, values.length) - 1);
  values.forEach((value, index) => {
    if (!value) return;
    const top = y(value, max);
    const bar = node("rect", { x: x(index, values.length), y: top, width, height: HEIGHT - PAD.bottom - top, class: "bar" });
    bar.append(node("title", {}, `${value}${unit}`));
    svg.append(bar);
  });
  return svg;
}

/** A line through the points that have a value (``null``: a gap). */
export function lineChart(label, values, unit = "") {
  const present = values.filter((value) => typeof value === "number");
  const max = Math.max(1, ...present);
  const svg = frame(label, max, unit);
  let path = "";
  values.forEach((value, index) => {
    if (typeof value !== "number") return;
    const point = `${x(index + 0.5, values.length).toFixed(1)} ${y(value, max).toFixed(1)}`;
    path += path ? ` L ${point}` : `M ${point}`;
    svg.append(node("circle", { cx: x(index + 0.5, values.length), cy: y(value, max), r: 2.5, class: "dot" }));
  });
  if (path) svg.append(node("path", { d: path, class: "line" }));
  return svg;
}
