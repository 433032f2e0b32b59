// hoard dashboard: plain ES2020, no build step. It is embedded in the binary, so it must not load
// anything from elsewhere. Text from the server only ever goes through textContent.
'use strict';

const API = '/_hoard/api/v1/';
// sessionStorage, not localStorage: the token is gone when the tab closes.
const TOKEN_KEY = 'hoard-admin-token';
const REFUSED = 'The admin token was refused.';
const PER_PAGE = 30;

const $ = (id) => document.getElementById(id);

// ---- Formatting ---------------------------------------------------------------------------

function formatBytes(n) {
  if (n == null) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  if (i === 0) return `${v} B`;
  // "1.2 MiB", "50 GiB", "219 MiB": one decimal only where it says something.
  return `${v < 100 ? v.toFixed(1).replace(/\.0$/, '') : v.toFixed(0)} ${units[i]}`;
}

const numberFormat = new Intl.NumberFormat();
const formatCount = (n) => (n == null ? '—' : numberFormat.format(n));
const formatRatio = (r) => (r == null ? '—' : `${(r * 100).toFixed(1)}%`);
// A share of a quota: a few bytes of 10 GiB are not "0.0%" (nothing).
const formatShare = (r) => (r > 0 && r < 0.0005 ? '< 0.1%' : formatRatio(r));

function formatDuration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  if (d > 0) return `${d} d ${h} h`;
  if (h > 0) return `${h} h ${m} min`;
  if (m > 0) return `${m} min`;
  return `${s} s`;
}

const dateFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });
const relativeFormat = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });

// A <time> saying "5 minutes ago", with the exact local date in its title.
function timeElement(iso) {
  const el = document.createElement('time');
  const date = new Date(iso);
  if (!iso || Number.isNaN(date.getTime())) {
    el.textContent = '—';
    return el;
  }
  el.dateTime = iso;
  el.title = dateFormat.format(date);
  const secs = (date.getTime() - Date.now()) / 1000;
  const abs = Math.abs(secs);
  if (abs < 45) el.textContent = 'just now';
  else if (abs < 3600) el.textContent = relativeFormat.format(Math.round(secs / 60), 'minute');
  else if (abs < 86400) el.textContent = relativeFormat.format(Math.round(secs / 3600), 'hour');
  else if (abs < 30 * 86400) el.textContent = relativeFormat.format(Math.round(secs / 86400), 'day');
  else el.textContent = dateFormat.format(date);
  return el;
}

// ---- DOM helpers ----------------------------------------------------------------------------

// A cell with text (or an element), optionally right-aligned for numbers.
function cell(content, className) {
  const td = document.createElement('td');
  if (content instanceof Node) td.append(content);
  else td.textContent = content;
  if (className) td.className = className;
  return td;
}

let statusTimer = 0;

// Confirmations fade after a while so the floating message does not hide the table; errors stay.
function setStatus(text, isError = false) {
  const el = $('status');
  el.textContent = text;
  el.classList.toggle('error', isError);
  clearTimeout(statusTimer);
  if (text && !isError) statusTimer = setTimeout(() => setStatus(''), 8000);
}

// ---- API ------------------------------------------------------------------------------------

class SignedOut extends Error {}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// Every call carries the token in a header (never the URL); a 401 anywhere means sign in again.
// The answer as it came, for what is not JSON (an entry's archive).
async function authorized(path, options = {}, accept = 'application/json') {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) {
    showSignIn('');
    throw new SignedOut();
  }
  const res = await fetch(API + path, {
    ...options,
    cache: 'no-store',
    headers: { Authorization: `Bearer ${token}`, Accept: accept },
  });
  if (res.status === 401) {
    showSignIn(REFUSED);
    throw new SignedOut();
  }
  return res;
}

// A JSON call: the parsed answer, or an ApiError with the server's sentence.
async function api(path, options = {}) {
  const res = await authorized(path, options);
  const body = await res.json().catch(() => null);
  if (!res.ok) throw new ApiError(res.status, (body && body.message) || `HTTP ${res.status}`);
  return body;
}

// An answer this page cannot read is an error to show, not a reason to break the page.
function expect(ok, what) {
  if (!ok) throw new Error(`the server's answer to ${what} is not what this dashboard reads (is the server another version?)`);
}

const isObject = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);
const isEntry = (e) => isObject(e) && Number.isSafeInteger(e.id) && typeof e.key === 'string';
const isDeleted = (d) => isObject(d) && Number.isSafeInteger(d.deleted);
// Text of a field that may be missing.
const str = (v) => (v == null ? '' : String(v));

// Show a failed call in the status line; a sign-out already said what happened.
function report(err) {
  if (err instanceof SignedOut) return;
  setStatus(`Error: ${err.message}`, true);
}

// ---- Sign in / out --------------------------------------------------------------------------

function showSignIn(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  // Drop what was shown so nothing lingers behind the sign-in form.
  document.querySelectorAll('tbody').forEach((tb) => tb.replaceChildren());
  document.querySelectorAll('#overview .value, #overview .detail').forEach((el) => { el.textContent = ''; });
  if ($('confirm').open) $('confirm').close();
  $('signin-error').textContent = message;
  $('nav').hidden = true;
  $('signout').hidden = true;
  $('overview').hidden = true;
  $('repository').hidden = true;
  $('entries').hidden = true;
  $('policy').hidden = true;
  clearInsight();
  $('signin').hidden = false;
  setStatus('');
  $('token').focus();
}

$('signin-form').addEventListener('submit', (event) => {
  event.preventDefault();
  const input = $('token');
  const token = input.value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  input.value = '';
  $('signin-error').textContent = '';
  // A wrong token comes back as a 401 from the first call, which returns us to this form.
  route();
});

$('signout').addEventListener('click', () => {
  showSignIn('');
  setStatus('Signed out.');
});

// ---- Navigation -----------------------------------------------------------------------------

const REPOSITORY_HASH = '#repository/';
// The entries page, with what it shows in a query string: `#entries?run_id=123&state=quarantined`
// (see entriesView). `#/caches?…`, after the API's name, opens it too.
const ENTRIES_HASH = /^#\/?(?:entries|caches)(?:\?(.*))?$/;

function currentView() {
  if (ENTRIES_HASH.test(location.hash)) return 'entries';
  if (location.hash === '#policy') return 'policy';
  if (location.hash.startsWith(REPOSITORY_HASH)) return 'repository';
  return 'overview';
}

// The repository a `#repository/<name or id>` page is about.
function currentRepository() {
  try {
    return decodeURIComponent(location.hash.slice(REPOSITORY_HASH.length)).trim();
  } catch {
    return '';
  }
}

function route() {
  if (!sessionStorage.getItem(TOKEN_KEY)) {
    showSignIn($('signin-error').textContent);
    return;
  }
  const view = currentView();
  $('signin').hidden = true;
  $('nav').hidden = false;
  $('signout').hidden = false;
  $('overview').hidden = view !== 'overview';
  $('repository').hidden = view !== 'repository';
  $('entries').hidden = view !== 'entries';
  $('policy').hidden = view !== 'policy';
  document.querySelectorAll('#nav a').forEach((a) => {
    if (a.dataset.view === view) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  });
  if (view === 'overview') {
    showInsight('overview-insight', null);
    loadOverview().catch(report);
  } else if (view === 'repository') {
    loadRepository(currentRepository());
  } else if (view === 'policy') {
    $('insight').hidden = true;
    loadPolicy().catch(report);
  } else {
    $('insight').hidden = true;
    loadEntries().catch(report);
  }
}

window.addEventListener('hashchange', () => {
  setStatus('');
  route();
});

// ---- Overview -------------------------------------------------------------------------------

async function loadOverview() {
  const [status, usage] = await Promise.all([api('status'), api('usage?limit=10')]);
  renderStatus(status);
  renderUsage(usage, status.limits || {});
}

function renderStatus(s) {
  const used = s.usage.size_in_bytes;
  const max = s.limits && s.limits.max_storage;
  const quota = s.limits && s.limits.repository_quota;
  const meter = $('storage-meter');
  if (max) {
    const of = document.createElement('span');
    of.className = 'of';
    of.textContent = ` of ${formatBytes(max)}`;
    $('storage-value').replaceChildren(formatBytes(used), of);
    meter.value = Math.min(1, used / max);
    meter.textContent = formatRatio(used / max);
    meter.setAttribute('aria-label', `Storage used: ${formatRatio(used / max)} of the limit`);
    meter.hidden = false;
  } else {
    $('storage-value').textContent = formatBytes(used);
    meter.hidden = true;
  }
  $('storage-detail').textContent = [
    max ? `${formatRatio(used / max)} of the server limit` : 'No server-wide limit',
    quota ? `quota ${formatBytes(quota)} per repository` : '',
  ].filter(Boolean).join('; ');

  $('entries-value').textContent = formatCount(s.usage.entries);
  // Quarantined entries are out of lookups but kept: one click to them.
  const quarantined = document.createElement('a');
  quarantined.href = entriesHref({ filter: {}, state: 'quarantined' });
  quarantined.dataset.testid = 'quarantined-link';
  quarantined.textContent = s.quarantined > 0
    ? `${formatCount(s.quarantined)} quarantined since start: see them`
    : 'See quarantined entries';
  $('entries-detail').replaceChildren(quarantined);
  $('uploads-value').textContent = formatCount(s.usage.open_uploads);

  const { hits, misses, hit_ratio: ratio } = s.lookups;
  $('ratio-value').textContent = formatRatio(ratio);
  $('ratio-detail').textContent = ratio == null
    ? 'No lookups yet'
    : `${formatCount(hits)} hits, ${formatCount(misses)} misses`;

  $('uptime-value').textContent = `Up ${formatDuration(s.uptime_seconds)}`;
  $('server-detail').textContent = `Version ${s.version} · ${s.database} · ${s.storage} storage`;

  const warnings = s.warnings || [];
  $('warning-list').replaceChildren(...warnings.map((w) => {
    const li = document.createElement('li');
    li.textContent = w;
    return li;
  }));
  $('warnings').hidden = warnings.length === 0;
}

function renderUsage(usage, limits) {
  const quota = limits.repository_quota;
  const rows = usage.repositories.map((r) => {
    const name = r.full_name || r.repository_id;
    const label = r.full_name || `id ${r.repository_id}`;
    // The name opens the repository's page: its charts, families and a way to its entries.
    const link = document.createElement('a');
    link.href = repositoryHref(name);
    link.textContent = label;
    link.title = `Charts and families of ${label}`;
    link.dataset.testid = 'repo-link';
    const size = quota
      ? `${formatBytes(r.active_caches_size_in_bytes)} (${formatShare(r.active_caches_size_in_bytes / quota)} of quota)`
      : formatBytes(r.active_caches_size_in_bytes);
    // Bytes per scope class: branches, and pull requests and tags (their own share of the quota).
    const branches = cell(formatBytes(r.branch_caches_size_in_bytes), 'num');
    branches.dataset.testid = 'repo-branch-bytes';
    branches.title = `${formatCount(r.branch_caches_count)} entries of branches`;
    const prsAndTags = cell(formatBytes(r.pr_and_tag_caches_size_in_bytes), 'num');
    prsAndTags.dataset.testid = 'repo-pr-tag-bytes';
    prsAndTags.title = `${formatCount(r.pr_and_tag_caches_count)} entries of pull requests and tags`;
    const tr = document.createElement('tr');
    tr.append(
      cell(link),
      cell(size, 'num'),
      cell(formatCount(r.active_caches_count), 'num'),
      branches,
      prsAndTags,
      cell(formatCount(r.hits), 'num'),
      cell(formatRatio(r.hit_ratio), 'num'),
    );
    return tr;
  });
  $('repos').querySelector('tbody').replaceChildren(...rows);
  $('repos').hidden = rows.length === 0;
  $('repos-empty').hidden = rows.length !== 0;
  const count = usage.repository_count;
  $('repos-caption').textContent = count > rows.length
    ? `The ${rows.length} largest of ${formatCount(count)} repositories`
    : `${formatCount(count)} ${count === 1 ? 'repository' : 'repositories'}, largest first`;
}

function showRepository(name) {
  location.hash = entriesHref({ filter: { repository: name } });
}

// ---- Repository page ------------------------------------------------------------------------

function repositoryHref(nameOrId) {
  return `${REPOSITORY_HASH}${encodeURIComponent(nameOrId)}`;
}

function loadRepository(name) {
  $('repository-name').textContent = name || '(none)';
  $('repository-detail').textContent = '';
  $('repository-entries').onclick = () => showRepository(name);
  if (!name) {
    $('insight').hidden = true;
    setStatus('No repository given: open one from the overview.', true);
    return;
  }
  showInsight('repository-insight', name);
}

// ---- Insight: charts of the statistics API --------------------------------------------------

// What each period asks the API for. 7 days are days (like the families' trend), not 168 hours.
const PERIODS = {
  '24h': { bucket: 'hour', since: '24h', words: 'the last 24 hours', per: 'per hour' },
  '7d': { bucket: 'day', since: '7d', words: 'the last 7 days', per: 'per day' },
  '30d': { bucket: 'day', since: '30d', words: 'the last 30 days', per: 'per day' },
};

// Okabe–Ito colours; each series that shares a chart with others also has its own texture
// (the patterns in index.html), and every chart has a legend with words and numbers.
const LOOKUP_SERIES = [
  { key: 'exact_hits', label: 'Exact hits', fill: '#0072B2' },
  { key: 'restore_key_hits', label: 'Restore-key hits', fill: 'url(#fill-stripes-sky)' },
  { key: 'misses', label: 'Misses', fill: 'url(#fill-cross-vermillion)' },
];
const CAUSES = [
  { key: 'evicted', label: 'Evicted (quota or limit)', fill: '#E69F00' },
  { key: 'expired', label: 'Expired (unused or too old)', fill: 'url(#fill-stripes-purple)' },
  { key: 'quarantined', label: 'Quarantined (damaged)', fill: 'url(#fill-cross-vermillion)' },
  { key: 'deleted', label: 'Deleted (by an operator)', fill: 'url(#fill-dots-green)' },
];
const SCOPE_CLASSES = [
  { key: 'default_branch', label: 'Default branch', fill: '#0072B2' },
  { key: 'other_branch', label: 'Other branches', fill: 'url(#fill-stripes-sky)' },
  { key: 'pull_request', label: 'Pull requests', fill: 'url(#fill-dots-orange)' },
  { key: 'tag', label: 'Tags', fill: 'url(#fill-cross-purple)' },
];
const CLASS_LABEL = Object.fromEntries(SCOPE_CLASSES.map((c) => [c.key, c.label]));
const FAMILY_FILL = '#0072B2';
const TOP_FAMILIES = 10; // bars in the stored-by-family chart; the rest are summed in one
const FAMILY_ROWS = 100; // rows of the family table drawn at once
const FAMILY_LIMIT = 1000; // the API's maximum

let period = '24h';
let insightRepository = null; // the repository the charts are about; null: the whole server
let insightSeq = 0; // only the newest answer is drawn when periods are switched quickly
let familyRows = [];
let familySort = { key: 'misses', dir: 'desc' };

// Puts the one set of charts into the slot of the view shown, and loads it.
function showInsight(slot, repository) {
  const insight = $('insight');
  $(slot).append(insight);
  insight.hidden = false;
  insightRepository = repository;
  delete insight.dataset.showing;
  loadInsight().catch(insightFailed);
}

// Charts of another view or period must not stay up as if they were the answer; the period
// control stays, to try another.
function insightFailed(err) {
  if (!(err instanceof SignedOut)) clearCharts();
  report(err);
}

function clearInsight() {
  insightSeq++;
  $('insight').hidden = true;
  clearCharts();
}

function clearCharts() {
  delete $('insight').dataset.showing;
  $('insight-summary').textContent = '';
  document.querySelectorAll('#insight .plot, #insight .legend, #insight .numbers, #insight [data-role="note"]')
    .forEach((el) => el.replaceChildren());
  $('family-table').querySelector('thead tr').replaceChildren();
  $('family-table').querySelector('tbody').replaceChildren();
  $('family-caption').textContent = '';
}

document.querySelectorAll('input[name="period"]').forEach((input) => {
  input.addEventListener('change', () => {
    if (!input.checked) return;
    period = input.value;
    loadInsight().catch(insightFailed);
  });
});

async function loadInsight() {
  const p = PERIODS[period];
  const stats = new URLSearchParams({ bucket: p.bucket, since: p.since });
  const families = new URLSearchParams({ since: p.since, sort: 'misses', limit: String(FAMILY_LIMIT) });
  if (insightRepository) {
    stats.set('repository', insightRepository);
    families.set('repository', insightRepository);
  }
  const seq = ++insightSeq;
  const $insight = $('insight');
  $insight.setAttribute('aria-busy', 'true');
  try {
    const [series, fams] = await Promise.all([api(`stats?${stats}`), api(`stats/families?${families}`)]);
    if (seq !== insightSeq) return;
    renderInsight(series, fams, p);
    // What the charts show now, for whoever waits on them (a test, a screen reader's busy state).
    $insight.dataset.showing = `${insightRepository || ''}|${period}`;
  } finally {
    if (seq === insightSeq) $insight.removeAttribute('aria-busy');
  }
}

function renderInsight(stats, fams, p) {
  const t = stats.totals;
  const hits = t.exact_hits + t.restore_key_hits;
  const evictions = t.evictions === 1 ? '1 eviction' : `${formatCount(t.evictions)} evictions`;
  $('insight-summary').textContent = `In ${p.words}: ${formatCount(t.lookups)} lookups, `
    + `${formatCount(hits)} hits (${formatRatio(t.lookups ? hits / t.lookups : null)}), `
    + `${formatCount(t.misses)} misses; ${formatCount(t.saves)} saves (${formatBytes(t.bytes_saved)}); ${evictions}`
    + `${refusedByPolicy(t)}${fromPromotion(t)}.`;
  if (insightRepository) {
    const named = fams.families.find((f) => f.repository_name);
    if (named) $('repository-name').textContent = named.repository_name;
    $('repository-detail').textContent = fams.quota_bytes
      ? `${formatBytes(fams.stored_bytes)} stored of its ${formatBytes(fams.quota_bytes)} quota (${formatShare(fams.stored_bytes / fams.quota_bytes)})`
      : `${formatBytes(fams.stored_bytes)} stored`;
  }
  const points = stats.series;
  renderHitRatio(points, stats.bucket, p);
  renderLookups(points, stats.bucket, p);
  renderEvictions(points, stats.bucket, p);
  renderStoredByFamily(fams);
  renderStoredByClass(fams);
  familyRows = fams.families;
  renderFamilyTable();
}

// ---- Chart drawing -------------------------------------------------------------------------

const SVG_NS = 'http://www.w3.org/2000/svg';

// An SVG element with attributes (null ones left out) and children (strings become text).
function svg(name, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) if (v != null) el.setAttribute(k, String(v));
  el.append(...children);
  return el;
}

const svgTitle = (text) => svg('title', {}, text);

// The chart's parts, by its data-testid: drawing, legend, numbers table and a note.
function chartParts(testid) {
  const fig = document.querySelector(`[data-testid="${testid}"]`);
  return {
    plot: fig.querySelector('.plot'),
    legend: fig.querySelector('.legend'),
    numbers: fig.querySelector('.numbers'),
    note: fig.querySelector('[data-role="note"]'),
  };
}

// A small square painted like a series, for legends.
function swatch(fill) {
  return svg('svg', { class: 'swatch', viewBox: '0 0 14 14', width: 14, height: 14, 'aria-hidden': 'true' },
    svg('rect', { width: 14, height: 14, rx: 2, fill, stroke: '#1f2328', 'stroke-width': 0.6 }));
}

function legend(el, items) {
  el.replaceChildren(...items.map(({ fill, label, value }) => {
    const li = document.createElement('li');
    const name = document.createElement('span');
    name.textContent = label;
    const num = document.createElement('span');
    num.className = 'legend-value';
    num.textContent = value;
    li.append(swatch(fill), name, num);
    return li;
  }));
}

// A table of the numbers a chart draws, for reading and for screen readers.
function numbersTable(el, headers, rows) {
  const table = document.createElement('table');
  table.className = 'numbers-table';
  const head = document.createElement('tr');
  headers.forEach((h, i) => {
    const th = document.createElement('th');
    th.scope = 'col';
    th.textContent = h;
    if (i > 0) th.className = 'num';
    head.append(th);
  });
  const thead = document.createElement('thead');
  thead.append(head);
  const tbody = document.createElement('tbody');
  tbody.append(...rows.map((cells) => {
    const tr = document.createElement('tr');
    cells.forEach((c, i) => tr.append(cell(c, i > 0 ? 'num' : '')));
    return tr;
  }));
  table.append(thead, tbody);
  el.replaceChildren(table);
}

// Bucket starts are UTC (the server's hours and days); so are the labels.
const hourFormat = new Intl.DateTimeFormat(undefined, { timeZone: 'UTC', hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });
const dayFormat = new Intl.DateTimeFormat(undefined, { timeZone: 'UTC', day: 'numeric', month: 'short' });
const hourTitleFormat = new Intl.DateTimeFormat(undefined, { timeZone: 'UTC', dateStyle: 'medium', timeStyle: 'short' });
const dayTitleFormat = new Intl.DateTimeFormat(undefined, { timeZone: 'UTC', dateStyle: 'medium' });

const bucketLabel = (start, bucket) => (bucket === 'hour' ? hourFormat : dayFormat).format(new Date(start));
const bucketTitle = (start, bucket) => (bucket === 'hour'
  ? `${hourTitleFormat.format(new Date(start))} UTC, 1 hour`
  : `${dayTitleFormat.format(new Date(start))} (UTC day)`);

const W = 560; // a chart's drawing width (its viewBox); the page scales it to the card
const WIDE = 1150; // the same for a chart across the page
const PLOT = { top: 12, right: 12, bottom: 26, left: 46, height: 200 };

// Round steps for an axis up to at least `max`: 0, step, 2·step, …
function niceTicks(max, integer) {
  if (!(max > 0)) return integer ? [0, 1] : [0, 0.5, 1];
  const rough = max / 4;
  const mag = 10 ** Math.floor(Math.log10(rough));
  let step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= rough);
  if (integer) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let v = 0; v < max + step; v += step) {
    ticks.push(v);
    if (v >= max) break;
  }
  return ticks;
}

// The frame of a time chart over `n` buckets: axes, grid lines and bucket labels.
function timeFrame(points, bucket, ticks, formatTick) {
  const n = points.length;
  const innerW = W - PLOT.left - PLOT.right;
  const innerH = PLOT.height - PLOT.top - PLOT.bottom;
  const band = innerW / Math.max(1, n);
  const top = ticks[ticks.length - 1];
  const y = (v) => PLOT.top + innerH - (v / top) * innerH;
  const x = (i) => PLOT.left + i * band;
  const grid = svg('g', { class: 'axis', 'aria-hidden': 'true' });
  for (const t of ticks) {
    grid.append(
      svg('line', { x1: PLOT.left, x2: W - PLOT.right, y1: y(t), y2: y(t), class: t === 0 ? 'baseline' : 'grid' }),
      svg('text', { x: PLOT.left - 6, y: y(t) + 4, 'text-anchor': 'end' }, formatTick(t)),
    );
  }
  // At most about eight labels, the newest bucket always among them.
  const every = Math.ceil(n / 8);
  points.forEach((pt, i) => {
    if ((n - 1 - i) % every !== 0) return;
    grid.append(svg('text', { x: x(i) + band / 2, y: PLOT.height - 8, 'text-anchor': 'middle' }, bucketLabel(pt.start, bucket)));
  });
  return { band, x, y, grid, innerH };
}

function chartSvg(label, height, ...children) {
  return wideSvg(W, label, height, ...children);
}

function wideSvg(width, label, height, ...children) {
  return svg('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': label, class: 'chart-svg' }, ...children);
}

// Stacked bars per bucket of the `series` keys of each point (`read(point)` gives the values).
function stackedBars(points, bucket, series, read, describe) {
  const values = points.map(read);
  const totals = values.map((v) => series.reduce((sum, s) => sum + (v[s.key] || 0), 0));
  const ticks = niceTicks(Math.max(0, ...totals), true);
  const f = timeFrame(points, bucket, ticks, formatCount);
  const bars = svg('g');
  points.forEach((pt, i) => {
    const g = svg('g', { 'data-point': '', 'data-start': pt.start, 'data-value': totals[i] });
    for (const s of series) g.setAttribute(`data-${s.key.replace(/_/g, '-')}`, values[i][s.key] || 0);
    g.append(svgTitle(`${bucketTitle(pt.start, bucket)}: ${describe(values[i], totals[i])}`));
    // The whole band answers the pointer, so empty buckets have a tooltip too.
    g.append(svg('rect', { x: f.x(i), y: PLOT.top, width: f.band, height: f.innerH, class: 'hover' }));
    const w = Math.max(1, f.band * 0.72);
    let base = 0;
    for (const s of series) {
      const v = values[i][s.key] || 0;
      if (v > 0) {
        g.append(svg('rect', {
          x: f.x(i) + (f.band - w) / 2, y: f.y(base + v), width: w, height: f.y(base) - f.y(base + v),
          fill: s.fill, class: 'bar',
        }));
      }
      base += v;
    }
    bars.append(g);
  });
  return { grid: f.grid, bars, totals };
}

function renderLookups(points, bucket, p) {
  const parts = chartParts('chart-lookups');
  const describe = (v, total) => `${formatCount(total)} lookups: ${formatCount(v.exact_hits)} exact hits, `
    + `${formatCount(v.restore_key_hits)} restore-key hits, ${formatCount(v.misses)} misses`;
  const { grid, bars } = stackedBars(points, bucket, LOOKUP_SERIES, (pt) => pt, describe);
  const sum = (key) => points.reduce((s, pt) => s + pt[key], 0);
  parts.plot.replaceChildren(chartSvg(`Lookups ${p.per} over ${p.words}, stacked: exact hits, restore-key hits, misses`, PLOT.height, grid, bars));
  parts.note.textContent = `Lookups ${p.per}, hits below, misses on top.`;
  legend(parts.legend, LOOKUP_SERIES.map((s) => ({ ...s, value: formatCount(sum(s.key)) })));
  numbersTable(parts.numbers, ['Start (UTC)', 'Lookups', 'Exact hits', 'Restore-key hits', 'Misses'],
    points.map((pt) => [bucketTitle(pt.start, bucket), formatCount(pt.lookups), formatCount(pt.exact_hits),
      formatCount(pt.restore_key_hits), formatCount(pt.misses)]));
}

function renderEvictions(points, bucket, p) {
  const parts = chartParts('chart-evictions');
  const describe = (v, total) => `${formatCount(total)} evictions: `
    + CAUSES.map((c) => `${formatCount(v[c.key] || 0)} ${c.key}`).join(', ');
  const read = (pt) => pt.evictions_by_cause || {};
  const { grid, bars } = stackedBars(points, bucket, CAUSES, read, describe);
  const sum = (key) => points.reduce((s, pt) => s + (read(pt)[key] || 0), 0);
  parts.plot.replaceChildren(chartSvg(`Evictions ${p.per} over ${p.words}, stacked by cause`, PLOT.height, grid, bars));
  parts.note.textContent = `Entries removed ${p.per}, by why they went.`;
  legend(parts.legend, CAUSES.map((c) => ({ ...c, value: formatCount(sum(c.key)) })));
  numbersTable(parts.numbers, ['Start (UTC)', 'Evictions', ...CAUSES.map((c) => c.label)],
    points.map((pt) => [bucketTitle(pt.start, bucket), formatCount(pt.evictions),
      ...CAUSES.map((c) => formatCount(read(pt)[c.key] || 0))]));
}

const hitRatioOf = (pt) => (pt.lookups ? (pt.exact_hits + pt.restore_key_hits) / pt.lookups : null);

function renderHitRatio(points, bucket, p) {
  const parts = chartParts('chart-hit-ratio');
  const ratios = points.map(hitRatioOf);
  const f = timeFrame(points, bucket, [0, 0.25, 0.5, 0.75, 1], (t) => `${t * 100}%`);
  const cx = (i) => f.x(i) + f.band / 2;
  // The line breaks where a bucket had no lookups: there is no ratio to draw there.
  let d = '';
  ratios.forEach((r, i) => {
    if (r == null) return;
    d += `${i > 0 && ratios[i - 1] != null ? 'L' : 'M'}${cx(i).toFixed(1)} ${f.y(r).toFixed(1)}`;
  });
  const marks = svg('g');
  marks.append(svg('path', { d, class: 'line', fill: 'none', stroke: '#0072B2', 'stroke-width': 2.5 }));
  points.forEach((pt, i) => {
    const r = ratios[i];
    const g = svg('g', { 'data-point': '', 'data-start': pt.start, 'data-value': r == null ? '' : r, 'data-lookups': pt.lookups });
    const text = r == null ? 'no lookups' : `${formatRatio(r)} of ${formatCount(pt.lookups)} lookups`;
    g.append(svgTitle(`${bucketTitle(pt.start, bucket)}: ${text}`));
    g.append(svg('rect', { x: f.x(i), y: PLOT.top, width: f.band, height: f.innerH, class: 'hover' }));
    if (r != null) g.append(svg('circle', { cx: cx(i), cy: f.y(r), r: 4, fill: '#0072B2', stroke: '#fff', 'stroke-width': 1.5 }));
    marks.append(g);
  });
  const lookups = points.reduce((s, pt) => s + pt.lookups, 0);
  const hits = points.reduce((s, pt) => s + pt.exact_hits + pt.restore_key_hits, 0);
  const overall = lookups ? hits / lookups : null;
  parts.plot.replaceChildren(chartSvg(`Hit ratio ${p.per} over ${p.words}; ${formatRatio(overall)} overall`, PLOT.height, f.grid, marks));
  parts.note.textContent = `Hits (exact and restore-key) per lookup, ${p.per}; gaps: no lookups.`;
  legend(parts.legend, [{ fill: '#0072B2', label: `Hit ratio over ${p.words}`, value: formatRatio(overall) }]);
  numbersTable(parts.numbers, ['Start (UTC)', 'Hit ratio', 'Lookups'],
    points.map((pt, i) => [bucketTitle(pt.start, bucket), formatRatio(ratios[i]), formatCount(pt.lookups)]));
}

// Horizontal bars, one per row ({key, label, title, value, fill}), on a scale up to `scaleMax`;
// `quota` (or null) adds each bar's share of it and, when it is the scale, a line at its end.
function barRows(rows, scaleMax, quota, { width = W, labelW = 210, mono = false } = {}) {
  const rowH = 26;
  const valueW = 130;
  const top = quota && scaleMax === quota ? 18 : 4;
  const height = top + rows.length * rowH + 4;
  const x0 = labelW + 8;
  const barMax = width - x0 - valueW;
  const maxChars = Math.floor(labelW / (mono ? 7.3 : 6.6));
  const g = svg('g');
  rows.forEach((row, i) => {
    const y = top + i * rowH;
    const w = scaleMax > 0 ? (row.value / scaleMax) * barMax : 0;
    const share = quota ? ` · ${formatShare(row.value / quota)}` : '';
    const label = row.label.length > maxChars ? `${row.label.slice(0, maxChars - 1)}…` : row.label;
    const p = svg('g', { 'data-point': '', 'data-label': row.key, 'data-value': row.value });
    p.append(
      svgTitle(`${row.title || row.label}: ${formatBytes(row.value)}${quota ? ` (${formatShare(row.value / quota)} of the quota)` : ''}`),
      svg('rect', { x: 0, y, width, height: rowH, class: 'hover' }),
      svg('text', { x: labelW, y: y + 17, 'text-anchor': 'end', class: mono ? 'bar-label mono' : 'bar-label' }, label),
      svg('rect', { x: x0, y: y + 5, width: barMax, height: rowH - 10, class: 'track' }),
      svg('rect', { x: x0, y: y + 5, width: row.value > 0 ? Math.max(2, w) : 0, height: rowH - 10, fill: row.fill, class: 'bar' }),
      svg('text', { x: x0 + barMax + 6, y: y + 17, class: 'bar-value' }, `${formatBytes(row.value)}${share}`),
    );
    g.append(p);
  });
  if (top > 4) {
    g.append(
      svg('line', { x1: x0 + barMax, x2: x0 + barMax, y1: 12, y2: height, class: 'quota' }),
      svg('text', { x: x0 + barMax, y: 10, 'text-anchor': 'end', class: 'bar-value' }, `quota ${formatBytes(quota)}`),
    );
  }
  return { g, height };
}

const quotaNote = (fams) => (fams.quota_bytes
  ? `${formatBytes(fams.stored_bytes)} stored of ${formatBytes(fams.quota_bytes)} (${formatShare(fams.stored_bytes / fams.quota_bytes)}).`
  : `${formatBytes(fams.stored_bytes)} stored; no limit for the whole server.`);

// The bytes of each family (its scope classes together), largest first; the rest in one bar.
function renderStoredByFamily(fams) {
  const parts = chartParts('chart-stored-family');
  const byFamily = new Map();
  for (const f of fams.families) {
    const id = `${f.repository}\u0000${f.family}`;
    const seen = byFamily.get(id) || { family: f.family, repository: f.repository_name || f.repository, value: 0 };
    seen.value += f.bytes_stored;
    byFamily.set(id, seen);
  }
  const all = [...byFamily.values()].filter((f) => f.value > 0).sort((a, b) => b.value - a.value);
  const serverWide = !insightRepository;
  const rows = all.slice(0, TOP_FAMILIES).map((f) => ({
    key: f.family,
    label: serverWide ? `${f.family} · ${f.repository}` : f.family,
    title: serverWide ? `${f.family} (${f.repository})` : f.family,
    value: f.value,
    fill: FAMILY_FILL,
  }));
  const rest = all.slice(TOP_FAMILIES);
  if (rest.length) {
    rows.push({ key: '', label: `${rest.length} more families`, value: rest.reduce((s, f) => s + f.value, 0), fill: 'url(#fill-stripes-sky)' });
  }
  if (rows.length === 0) {
    parts.plot.replaceChildren(emptyNote('No family has stored bytes.'));
  } else {
    const largest = rows.reduce((m, r) => Math.max(m, r.value), 0);
    const { g, height } = barRows(rows, largest, fams.quota_bytes, { width: WIDE, labelW: 420, mono: true });
    parts.plot.replaceChildren(wideSvg(WIDE, `Bytes stored by family, largest first. ${quotaNote(fams)}`, height, g));
  }
  parts.note.textContent = `${quotaNote(fams)} Bars compare families with each other${fams.quota_bytes ? '; the share is of the quota' : ''}.`;
  parts.legend.replaceChildren();
  numbersTable(parts.numbers, serverWide ? ['Family', 'Repository', 'Stored'] : ['Family', 'Stored'],
    all.map((f) => (serverWide ? [f.family, String(f.repository), formatBytes(f.value)] : [f.family, formatBytes(f.value)])));
}

// The bytes of each scope class against the quota (the scale is the quota when there is one).
function renderStoredByClass(fams) {
  const parts = chartParts('chart-stored-class');
  const bytes = Object.fromEntries(SCOPE_CLASSES.map((c) => [c.key, 0]));
  for (const f of fams.families) bytes[f.scope_class] = (bytes[f.scope_class] || 0) + f.bytes_stored;
  const rows = SCOPE_CLASSES.map((c) => ({ key: c.key, label: c.label, value: bytes[c.key], fill: c.fill }));
  const largest = rows.reduce((m, r) => Math.max(m, r.value), 0);
  const scale = fams.quota_bytes ? Math.max(fams.quota_bytes, largest) : largest;
  const { g, height } = barRows(rows, scale, fams.quota_bytes);
  parts.plot.replaceChildren(chartSvg(`Bytes stored by scope class. ${quotaNote(fams)}`, height, g));
  parts.note.textContent = fams.quota_bytes
    ? `${quotaNote(fams)} Bars are drawn against the quota.`
    : quotaNote(fams);
  parts.legend.replaceChildren();
  numbersTable(parts.numbers, ['Scope class', 'Stored'], rows.map((r) => [r.label, formatBytes(r.value)]));
}

function emptyNote(text) {
  const p = document.createElement('p');
  p.className = 'muted empty';
  p.textContent = text;
  return p;
}

// ---- Family table ---------------------------------------------------------------------------

const familyHits = (f) => f.exact_hits + f.restore_key_hits;
const FAMILY_COLUMNS = [
  { key: 'family', label: 'Family', text: true, value: (f) => f.family.toLowerCase() },
  { key: 'repository', label: 'Repository', text: true, serverOnly: true, value: (f) => String(f.repository_name || f.repository).toLowerCase() },
  { key: 'scope_class', label: 'Scope class', text: true, value: (f) => CLASS_LABEL[f.scope_class] || f.scope_class },
  { key: 'lookups', label: 'Lookups', value: (f) => f.lookups },
  { key: 'hits', label: 'Hits', value: familyHits },
  { key: 'misses', label: 'Misses', value: (f) => f.misses },
  { key: 'refused', label: 'Refused', value: (f) => (f.refused_writes || 0) + (f.refused_reads || 0) },
  { key: 'hit_ratio', label: 'Hit ratio', value: (f) => (f.hit_ratio == null ? -1 : f.hit_ratio) },
  { key: 'bytes_stored', label: 'Stored', value: (f) => f.bytes_stored },
  { key: 'entries', label: 'Entries', value: (f) => f.entries },
  { key: 'trend', label: 'Trend', unsortable: true },
];

function familyColumns() {
  return FAMILY_COLUMNS.filter((c) => !(c.serverOnly && insightRepository));
}

function sortFamilies(rows) {
  const col = FAMILY_COLUMNS.find((c) => c.key === familySort.key);
  const sign = familySort.dir === 'asc' ? 1 : -1;
  return [...rows].sort((a, b) => {
    const va = col.value(a);
    const vb = col.value(b);
    const byCol = col.text ? va.localeCompare(vb) : va - vb;
    // Ties: more lookups first, then by name, so the order is stable.
    return sign * byCol || b.lookups - a.lookups || a.family.localeCompare(b.family);
  });
}

function renderFamilyTable() {
  const table = $('family-table');
  const columns = familyColumns();
  const head = table.querySelector('thead tr');
  head.replaceChildren(...columns.map((c) => {
    const th = document.createElement('th');
    th.scope = 'col';
    if (!c.text && !c.unsortable) th.className = 'num';
    if (c.unsortable) {
      th.textContent = c.label;
      return th;
    }
    const active = familySort.key === c.key;
    th.setAttribute('aria-sort', active ? (familySort.dir === 'asc' ? 'ascending' : 'descending') : 'none');
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'sort';
    button.dataset.testid = `sort-${c.key.replace(/_/g, '-')}`;
    const arrow = document.createElement('span');
    arrow.setAttribute('aria-hidden', 'true');
    arrow.textContent = active ? (familySort.dir === 'asc' ? ' ▲' : ' ▼') : '';
    button.append(c.label, arrow);
    button.addEventListener('click', () => {
      // The active column turns round; another starts with the most (or A) first.
      familySort = active
        ? { key: c.key, dir: familySort.dir === 'asc' ? 'desc' : 'asc' }
        : { key: c.key, dir: c.text ? 'asc' : 'desc' };
      renderFamilyTable();
      table.querySelector(`[data-testid="${button.dataset.testid}"]`).focus();
    });
    th.append(button);
    return th;
  }));

  const sorted = sortFamilies(familyRows);
  const shown = sorted.slice(0, FAMILY_ROWS);
  const tbody = table.querySelector('tbody');
  if (shown.length === 0) {
    const td = cell(`No lookups or saves in ${PERIODS[period].words}.`, 'muted');
    td.colSpan = columns.length;
    const tr = document.createElement('tr');
    tr.append(td);
    tbody.replaceChildren(tr);
  } else {
    tbody.replaceChildren(...shown.map((f) => familyRow(f, columns)));
  }
  const sortedBy = FAMILY_COLUMNS.find((c) => c.key === familySort.key).label.toLowerCase();
  const capped = familyRows.length >= FAMILY_LIMIT ? ` (the ${FAMILY_LIMIT} with the most misses)` : '';
  $('family-caption').textContent = sorted.length > shown.length
    ? `The first ${shown.length} of ${formatCount(sorted.length)} families${capped}, by ${sortedBy}`
    : `${formatCount(sorted.length)} ${sorted.length === 1 ? 'family' : 'families'}, by ${sortedBy}`;
}

function familyRow(f, columns) {
  const tr = document.createElement('tr');
  tr.dataset.testid = 'family-row';
  tr.dataset.family = f.family;
  tr.dataset.scopeClass = f.scope_class;
  tr.dataset.repository = String(f.repository);
  const cells = {
    family: () => cell(f.family, 'key'),
    repository: () => {
      const a = document.createElement('a');
      a.href = repositoryHref(f.repository_name || f.repository);
      a.textContent = f.repository_name || `id ${f.repository}`;
      return cell(a);
    },
    scope_class: () => cell(CLASS_LABEL[f.scope_class] || f.scope_class, 'nowrap'),
    lookups: () => cell(formatCount(f.lookups), 'num'),
    hits: () => {
      const td = cell(formatCount(familyHits(f)), 'num');
      td.title = `${formatCount(f.exact_hits)} exact, ${formatCount(f.restore_key_hits)} by a restore key`
        + (f.promoted_hits ? `; ${formatCount(f.promoted_hits)} served by promoted entries` : '');
      return td;
    },
    misses: () => cell(formatCount(f.misses), 'num'),
    refused: () => {
      const td = cell(formatCount((f.refused_writes || 0) + (f.refused_reads || 0)), 'num');
      td.title = `Refused by the write policy: ${formatCount(f.refused_writes || 0)} writes, ${formatCount(f.refused_reads || 0)} lookups`;
      return td;
    },
    hit_ratio: () => cell(formatRatio(f.hit_ratio), 'num'),
    bytes_stored: () => cell(formatBytes(f.bytes_stored), 'num'),
    entries: () => cell(formatCount(f.entries), 'num'),
    trend: () => cell(sparkline(f.trend)),
  };
  tr.append(...columns.map((c) => {
    const td = cells[c.key]();
    td.dataset.col = c.key;
    const col = FAMILY_COLUMNS.find((x) => x.key === c.key);
    if (!col.text && !col.unsortable) td.dataset.value = String(c.key === 'hit_ratio' ? (f.hit_ratio ?? '') : col.value(f));
    return td;
  }));
  return tr;
}

// A family's lookups per bucket as tiny bars: hits below, misses (textured) on top.
function sparkline(trend) {
  const lookups = trend.lookups || [];
  const n = lookups.length;
  const w = 120;
  const h = 26;
  const band = w / Math.max(1, n);
  const top = Math.max(1, ...lookups);
  const y = (v) => h - 1 - (v / top) * (h - 3);
  const misses = trend.misses || [];
  const hits = trend.hits || [];
  const words = PERIODS[period].per;
  const el = svg('svg', {
    viewBox: `0 0 ${w} ${h}`, width: w, height: h, class: 'sparkline', role: 'img', 'data-testid': 'sparkline',
    'aria-label': `Lookups ${words}: ${lookups.join(', ')}; misses: ${misses.join(', ')}`,
  });
  el.append(svg('line', { x1: 0, x2: w, y1: h - 0.5, y2: h - 0.5, class: 'baseline' }));
  lookups.forEach((v, i) => {
    const g = svg('g', { 'data-point': '', 'data-value': v, 'data-hits': hits[i] || 0, 'data-misses': misses[i] || 0 });
    g.append(svgTitle(`${formatCount(v)} lookups, ${formatCount(misses[i] || 0)} misses`));
    const bw = Math.max(1, band - 1);
    const hit = hits[i] || 0;
    const miss = misses[i] || 0;
    if (hit > 0) g.append(svg('rect', { x: i * band, y: y(hit), width: bw, height: y(0) - y(hit), fill: '#0072B2' }));
    if (miss > 0) g.append(svg('rect', { x: i * band, y: y(hit + miss), width: bw, height: y(hit) - y(hit + miss), fill: 'url(#fill-cross-vermillion)' }));
    el.append(g);
  });
  return el;
}

// ---- Entries --------------------------------------------------------------------------------

// The entry filter, as the API names it (GET caches, DELETE caches).
const FILTERS = ['key', 'ref', 'repository', 'version', 'run_id', 'subject', 'kind', 'written_after',
  'written_before', 'digest', 'promoted_by'];
// The part of it a restore record keeps (GET restores): who wrote the entries, where and when.
const RESTORE_FILTERS = ['repository', 'ref', 'run_id', 'subject', 'kind', 'written_after', 'written_before'];
const FILTER_LABELS = {
  key: 'key prefix', ref: 'ref', repository: 'repository', version: 'version', run_id: 'run',
  subject: 'subject', kind: 'writer kind', written_after: 'written from', written_before: 'written before',
  digest: 'digest', promoted_by: 'promoted by',
};
const STATES = ['live', 'quarantined'];
const LISTING_DEFAULTS = { state: 'live', sort: 'last_accessed_at', direction: 'desc' };
const ENTRY_COLUMNS = 10;

let loadSeq = 0; // only the newest response is drawn when searches overlap
let shown = null; // { view, entries } of the page drawn
const selected = new Map(); // id → entry, of the page drawn

// What the address says the entries page shows: the filter, the state (live or quarantined),
// the sort and the page (a cursor), and any parameter it does not know.
function entriesView() {
  const match = ENTRIES_HASH.exec(location.hash);
  const view = { filter: {}, ...LISTING_DEFAULTS, cursor: null, unknown: [] };
  for (const [name, raw] of new URLSearchParams((match && match[1]) || '')) {
    const value = raw.trim();
    if (!value) continue;
    if (FILTERS.includes(name)) view.filter[name] = value;
    else if (name === 'scope') view.filter.ref = value;
    else if (name in LISTING_DEFAULTS) view[name] = value;
    else if (name === 'cursor') view.cursor = value;
    else view.unknown.push(name);
  }
  return view;
}

// The address of a view of the entries page; what is the default is left out.
function entriesHref(view) {
  const params = new URLSearchParams();
  for (const name of FILTERS) if (view.filter && view.filter[name]) params.set(name, view.filter[name]);
  for (const [name, dflt] of Object.entries(LISTING_DEFAULTS)) {
    if (view[name] && view[name] !== dflt) params.set(name, view[name]);
  }
  if (view.cursor) params.set('cursor', view.cursor);
  const query = params.toString();
  return query ? `#entries?${query}` : '#entries';
}

// Shows `view`: a new address (so Back returns to the one before), or the same one loaded again.
function showEntries(view) {
  const href = entriesHref(view);
  if (location.hash === href) loadEntries().catch(report);
  else location.hash = href;
}

// The filter's parameters for the API: `names` of it, in the order FILTERS lists them.
function filterParams(filter, names = FILTERS) {
  const params = new URLSearchParams();
  for (const name of names) if (filter[name]) params.set(name, filter[name]);
  return params;
}

// "run = 123, writer kind = github", for sentences about a filter.
function describeFilter(filter, names = FILTERS) {
  return names.filter((n) => filter[n]).map((n) => `${FILTER_LABELS[n]} = ${filter[n]}`).join(', ');
}

function readSearch() {
  const form = $('search').elements;
  const view = { filter: {}, cursor: null };
  for (const name of FILTERS) {
    const value = form[name].value.trim();
    if (value) view.filter[name] = value;
  }
  for (const name of Object.keys(LISTING_DEFAULTS)) view[name] = form[name].value;
  return view;
}

// The form shows the view in force, also when it came from a link.
function fillSearch(view) {
  const form = $('search').elements;
  for (const name of FILTERS) form[name].value = view.filter[name] || '';
  for (const name of Object.keys(LISTING_DEFAULTS)) {
    const select = form[name];
    select.value = view[name];
    if (select.value !== view[name]) select.value = LISTING_DEFAULTS[name];
  }
}

async function loadEntries() {
  const view = entriesView();
  fillSearch(view);
  showState(view.state);
  clearSelection();
  // What is drawn, once it is: the address of the view (for whoever waits on it, such as a test).
  delete $('entries').dataset.showing;
  if ($('radius').dataset.for !== JSON.stringify(view.filter)) closeRadius();
  const seq = ++loadSeq;
  try {
    if (view.unknown.length) {
      throw new Error(`the address names what is no filter: ${view.unknown.join(', ')} (filters: ${FILTERS.join(', ')}, state, sort, direction)`);
    }
    if (!STATES.includes(view.state)) throw new Error(`state must be live or quarantined, not ${view.state}`);
    const params = filterParams(view.filter);
    params.set('sort', view.sort);
    params.set('direction', view.direction);
    params.set('per_page', String(PER_PAGE));
    // Live is the API's default: a server without quarantine answers the usual listing.
    if (view.state !== 'live') params.set('state', view.state);
    if (view.cursor) params.set('cursor', view.cursor);
    const page = await api(`caches?${params}`);
    if (seq !== loadSeq) return;
    expect(isObject(page) && Array.isArray(page.actions_caches) && page.actions_caches.every(isEntry), 'a listing of entries');
    // A later page that has emptied (its entries deleted): go back to the first page.
    if (page.actions_caches.length === 0 && view.cursor) {
      history.replaceState(null, '', entriesHref({ ...view, cursor: null }));
      return loadEntries();
    }
    renderEntries(page, view);
  } catch (err) {
    // Whatever was listed before must not stay up as if it were this filter's answer.
    if (seq === loadSeq && !(err instanceof SignedOut)) failedEntries(err);
    throw err;
  }
}

function failedEntries(err) {
  shown = null;
  $('entries-total').textContent = '';
  const td = cell(`The entries could not be listed: ${err.message}`, 'error');
  td.colSpan = ENTRY_COLUMNS;
  td.dataset.testid = 'entries-error';
  const tr = document.createElement('tr');
  tr.append(td);
  $('entries-table').querySelector('tbody').replaceChildren(tr);
  $('next-page').hidden = true;
  $('first-page').hidden = true;
}

// What differs between live and quarantined entries: the time shown and what can be done.
function showState(state) {
  const quarantined = state === 'quarantined';
  $('entries-time-column').textContent = quarantined ? 'Quarantined' : 'Last used';
  $('review-selection').textContent = quarantined ? 'Delete selected for good…' : 'Delete or quarantine selected…';
  // A quarantined entry goes by itself (its id): the API takes no filter for them.
  $('review-filter').hidden = quarantined;
  $('entries').dataset.state = state;
}

function renderEntries(page, view) {
  const entries = page.actions_caches;
  shown = { view, entries };
  const total = Number(page.total_count) || 0;
  const noun = total === 1 ? 'entry' : 'entries';
  $('entries-total').textContent = view.state === 'quarantined'
    ? `${formatCount(total)} quarantined ${noun}`
    : `${formatCount(total)} ${noun}`;
  $('review-filter').textContent = `Delete or quarantine all ${formatCount(total)} matching…`;
  const tbody = $('entries-table').querySelector('tbody');
  if (entries.length === 0) {
    const td = cell(view.state === 'quarantined' ? 'No quarantined entry matches.' : 'No cache entries match.', 'muted');
    td.colSpan = ENTRY_COLUMNS;
    const tr = document.createElement('tr');
    tr.append(td);
    tbody.replaceChildren(tr);
  } else {
    tbody.replaceChildren(...entries.flatMap((e) => {
      const details = detailsRow(e);
      return [entryRow(e, details, view.state), details];
    }));
  }
  const next = $('next-page');
  next.hidden = page.next_cursor == null;
  next.dataset.cursor = str(page.next_cursor);
  $('first-page').hidden = view.cursor == null;
  updateSelection();
  $('entries').dataset.showing = entriesHref(view);
}

// ---- Entry details --------------------------------------------------------------------------

// A link to the entries of one filter value: the run that wrote an entry, its digest, …
function filterLink(name, value, title) {
  const a = document.createElement('a');
  a.href = entriesHref({ filter: { [name]: value } });
  a.textContent = value;
  a.title = title;
  return a;
}

// Who wrote the entry, its digest and, if quarantined, why: in a row under it that its key's
// button opens, which then also loads who restored it.
function detailsRow(e) {
  const tr = document.createElement('tr');
  tr.className = 'details';
  tr.dataset.testid = 'entry-details';
  tr.dataset.id = String(e.id);
  tr.hidden = true;
  const facts = document.createElement('dl');
  fillFacts(facts, e);
  const actions = document.createElement('div');
  actions.className = 'detail-actions';
  const restores = document.createElement('div');
  restores.className = 'restores';
  restores.dataset.testid = 'restore-section';
  const td = cell(facts);
  td.append(actions, restores);
  td.colSpan = ENTRY_COLUMNS;
  tr.append(td);
  tr.parts = { facts, actions, restores };
  return tr;
}

function fillFacts(list, e) {
  const w = isObject(e.written_by) ? e.written_by : null;
  const fields = [['Key', e.key], ['Repository id', e.repository_id], ['Version', e.version]];
  if (w) {
    fields.push(
      ['Written by', w.kind],
      ['Issuer', w.issuer],
      ['Subject', w.subject, w.subject && filterLink('subject', w.subject, 'Every entry this subject wrote')],
      ['Run', w.run_id, w.run_id && filterLink('run_id', w.run_id, 'Every entry this run wrote')],
      ['Job', w.job_id],
      ['Address', w.address],
    );
  } else {
    fields.push(['Written by', 'not recorded (saved before hoard kept writers)']);
  }
  fields.push(['Written at', e.created_at],
    ['Digest', e.digest, e.digest && filterLink('digest', e.digest, 'Every entry of these bytes, under any key')]);
  if (e.tool) fields.push(['Build tool', e.tool]);
  if (e.read_through) fields.push(['Read through', e.read_through]);
  const p = isObject(e.promoted) ? e.promoted : null;
  if (p) {
    fields.push(['Promoted from', p.from_ref],
      ['Promoted by', p.by, p.by && filterLink('promoted_by', p.by, 'Every entry this promotion made')],
      ['Promoted for', p.cause || 'by hand']);
  }
  if (e.state === 'quarantined') {
    fields.push(['State', 'quarantined'], ['Quarantined at', e.quarantined_at],
      ['Quarantine reason', e.quarantine_reason], ['Quarantine expires', e.quarantine_expires_at]);
  }
  list.replaceChildren(...fields.flatMap(([name, value, link]) => {
    const dt = document.createElement('dt');
    dt.textContent = name;
    const dd = document.createElement('dd');
    if (link) dd.append(link);
    else dd.textContent = str(value) || '—';
    dd.dataset.testid = `detail-${name.toLowerCase().replace(/ /g, '-')}`;
    return [dt, dd];
  }));
}

// `GET caches/{id}`: the entry as it is now, and who restored it.
async function openDetails(e, tr) {
  const { facts, actions, restores } = tr.parts;
  restores.setAttribute('aria-busy', 'true');
  restores.replaceChildren(paragraph('Loading who restored it…', 'muted'));
  let d;
  try {
    d = await api(`caches/${encodeURIComponent(e.id)}`);
    expect(isEntry(d) && Array.isArray(d.restored_by) && d.restored_by.every(isObject), 'an entry');
  } catch (err) {
    if (err instanceof SignedOut) return;
    const gone = err instanceof ApiError && err.status === 404;
    const p = paragraph(gone ? 'This entry is gone: deleted, evicted or expired since it was listed.'
      : `Who restored it could not be loaded: ${err.message}`, 'error');
    p.dataset.testid = 'detail-error';
    restores.replaceChildren(p);
    actions.replaceChildren();
    return;
  } finally {
    restores.removeAttribute('aria-busy');
  }
  fillFacts(facts, d);
  actions.replaceChildren(...entryActions(d));
  restores.replaceChildren(...restoreRecords(d));
}

function paragraph(text, className) {
  const p = document.createElement('p');
  p.textContent = text;
  if (className) p.className = className;
  return p;
}

function button(label, testid, className, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = className;
  b.textContent = label;
  b.dataset.testid = testid;
  b.addEventListener('click', () => onClick(b));
  return b;
}

// Download its archive (for any entry) and release it (a quarantined one).
function entryActions(e) {
  const items = [button('Download archive', 'download-button', 'secondary small', (b) => downloadArchive(e, b))];
  if (e.state === 'quarantined') {
    items.push(button('Release…', 'release-button', 'secondary small', () => reviewRelease(e)));
  }
  return items;
}

// Who restored the entry: its most recent readers, one row each.
function restoreRecords(e) {
  const title = document.createElement('h3');
  title.textContent = 'Restored by';
  const records = e.restored_by;
  if (records.length === 0) {
    const none = paragraph('No restore of this entry is recorded.', 'muted');
    none.dataset.testid = 'restore-records-none';
    return [title, none];
  }
  const table = document.createElement('table');
  table.className = 'records-table';
  table.dataset.testid = 'restore-records';
  const caption = document.createElement('caption');
  caption.className = 'muted';
  caption.textContent = `${records.length === 1 ? 'Its one reader' : `Its ${records.length} most recent readers, most recent first`}; `
    + `it was restored ${plural(Number(e.hits) || 0, 'time', 'times')} in all.`;
  const head = document.createElement('tr');
  for (const [label, cls] of [['Kind'], ['Subject'], ['Run'], ['Job'], ['Address'], ['Restores', 'num'],
    ['First'], ['Last']]) {
    const th = document.createElement('th');
    th.scope = 'col';
    th.textContent = label;
    if (cls) th.className = cls;
    head.append(th);
  }
  const thead = document.createElement('thead');
  thead.append(head);
  const tbody = document.createElement('tbody');
  tbody.append(...records.map((r) => {
    const reader = isObject(r.reader) ? r.reader : {};
    const tr = document.createElement('tr');
    tr.dataset.testid = 'restore-record';
    tr.dataset.run = str(reader.run_id);
    tr.dataset.job = str(reader.job_id);
    tr.append(
      cell(str(reader.kind) || '—'),
      cell(str(reader.subject) || '—', 'mono-wrap'),
      cell(reader.run_id ? filterLink('run_id', str(reader.run_id), 'Every entry this run wrote') : '—'),
      cell(str(reader.job_id) || '—'),
      cell(str(reader.address) || '—', 'mono'),
      cell(formatCount(r.count), 'num'),
      cell(timeElement(r.first_restored_at)),
      cell(timeElement(r.last_restored_at)),
    );
    return tr;
  }));
  table.append(caption, thead, tbody);
  return [title, table];
}

// The archive comes with the bearer token, so through fetch, as a Blob handed to the browser
// under a name of our own (with the extension its first bytes say: zstd or gzip tar).
async function downloadArchive(e, b) {
  b.disabled = true;
  setStatus(`Downloading the archive of ${e.key}…`);
  try {
    const res = await authorized(`caches/${encodeURIComponent(e.id)}/content`, {}, 'application/octet-stream');
    if (!res.ok) {
      const body = await res.json().catch(() => null);
      throw new ApiError(res.status, (body && body.message) || `HTTP ${res.status}`);
    }
    const blob = await res.blob();
    const magic = new Uint8Array(await blob.slice(0, 4).arrayBuffer());
    const ext = magic[0] === 0x28 && magic[1] === 0xb5 && magic[2] === 0x2f && magic[3] === 0xfd ? '.tzst'
      : magic[0] === 0x1f && magic[1] === 0x8b ? '.tgz' : '.bin';
    const name = `hoard-entry-${Number(e.id)}${ext}`;
    const url = URL.createObjectURL(blob);
    const a = document.createElement('a');
    a.href = url;
    a.download = name;
    a.hidden = true;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    setStatus(`Downloaded the archive of ${e.key} (${formatBytes(blob.size)}) as ${name}.`);
  } catch (err) {
    report(err);
  } finally {
    b.disabled = false;
  }
}

function entryRow(e, details, state) {
  const tr = document.createElement('tr');
  tr.dataset.testid = 'entry-row';
  tr.dataset.id = String(e.id);
  tr.dataset.state = str(e.state) || state;

  const check = document.createElement('input');
  check.type = 'checkbox';
  check.dataset.testid = 'select-entry';
  check.setAttribute('aria-label', `Select ${e.key}`);
  check.addEventListener('change', () => {
    if (check.checked) selected.set(e.id, e);
    else selected.delete(e.id);
    updateSelection();
  });

  const key = document.createElement('button');
  key.type = 'button';
  key.className = 'link';
  key.textContent = e.key;
  key.dataset.testid = 'details-button';
  key.setAttribute('aria-expanded', 'false');
  key.addEventListener('click', () => {
    details.hidden = !details.hidden;
    key.setAttribute('aria-expanded', String(!details.hidden));
    if (!details.hidden) openDetails(e, details);
  });

  const version = document.createElement('span');
  const v = str(e.version);
  version.textContent = v.length > 10 ? `${v.slice(0, 8)}…` : v;
  version.title = v;

  const del = document.createElement('button');
  del.type = 'button';
  del.className = 'danger small';
  del.textContent = 'Delete';
  del.dataset.testid = 'delete-button';
  del.setAttribute('aria-label', `Delete ${e.key}`);
  del.addEventListener('click', () => review({ kind: 'entry', entries: [e], state }));

  const when = state === 'quarantined' ? e.quarantined_at : e.last_accessed_at;
  tr.append(
    cell(check, 'select'),
    cell(key, 'key'),
    cell(str(e.repository) || `id ${str(e.repository_id)}`),
    cell(str(e.ref), 'ref'),
    cell(version, 'mono'),
    cell(formatBytes(e.size_in_bytes), 'num'),
    cell(timeElement(e.created_at)),
    cell(timeElement(when)),
    cell(formatCount(e.hits), 'num'),
    cell(del),
  );
  return tr;
}

// ---- Selection ------------------------------------------------------------------------------

function clearSelection() {
  selected.clear();
  updateSelection();
}

function updateSelection() {
  const rows = shown ? shown.entries.length : 0;
  const n = selected.size;
  $('selected-count').textContent = `${formatCount(n)} selected`;
  $('review-selection').disabled = n === 0;
  const all = $('select-all');
  all.checked = rows > 0 && n === rows;
  all.indeterminate = n > 0 && n < rows;
  all.disabled = rows === 0;
}

$('select-all').addEventListener('change', () => {
  const on = $('select-all').checked;
  selected.clear();
  if (on && shown) for (const e of shown.entries) selected.set(e.id, e);
  document.querySelectorAll('#entries-table [data-testid="select-entry"]').forEach((box) => { box.checked = on; });
  updateSelection();
});

$('search').addEventListener('submit', (event) => {
  event.preventDefault();
  setStatus('');
  showEntries(readSearch());
});

// Live or quarantined: a switch, taken at once.
$('search-state').addEventListener('change', () => showEntries(readSearch()));

$('search-clear').addEventListener('click', () => {
  showEntries({ filter: {}, state: entriesView().state });
});

$('next-page').addEventListener('click', () => {
  const cursor = $('next-page').dataset.cursor || null;
  if (!cursor) return;
  showEntries({ ...entriesView(), cursor });
  $('entries-title').scrollIntoView();
});

$('first-page').addEventListener('click', () => showEntries({ ...entriesView(), cursor: null }));

$('review-selection').addEventListener('click', () => {
  if (!shown || selected.size === 0) return;
  review({ kind: 'selection', entries: [...selected.values()], state: shown.view.state });
});

$('review-filter').addEventListener('click', () => {
  const view = entriesView();
  if (Object.keys(view.filter).length === 0) {
    setStatus('Set a filter first (a run, a subject, a key prefix, …): the dashboard does not delete every entry at once.', true);
    return;
  }
  review({ kind: 'filter', filter: view.filter, state: view.state });
});

$('blast-radius-button').addEventListener('click', () => loadRadius().catch(radiusFailed));
$('radius-close').addEventListener('click', closeRadius);

// ---- Blast radius ---------------------------------------------------------------------------

let radiusSeq = 0;

function closeRadius() {
  radiusSeq++;
  const radius = $('radius');
  radius.hidden = true;
  delete radius.dataset.for;
  delete radius.dataset.truncated;
}

// `GET restores` for the writer part of the filter: which jobs restored what it wrote.
async function loadRadius() {
  const view = entriesView();
  const seq = ++radiusSeq;
  const radius = $('radius');
  radius.hidden = false;
  radius.dataset.for = JSON.stringify(view.filter);
  delete radius.dataset.truncated;
  radius.setAttribute('aria-busy', 'true');
  const writers = describeFilter(view.filter, RESTORE_FILTERS);
  const ignored = FILTERS.filter((n) => view.filter[n] && !RESTORE_FILTERS.includes(n)).map((n) => FILTER_LABELS[n]);
  $('radius-scope').textContent = (writers
    ? `The jobs that restored entries written under ${writers}`
    : 'The jobs that restored any entry (no writer filter is set)')
    + (ignored.length ? `. A restore record does not keep the ${ignored.join(', ')}: this covers every entry of the rest of the filter.` : '.');
  $('radius-truncated').hidden = true;
  $('radius-jobs').querySelector('tbody').replaceChildren();
  $('radius-records').querySelector('tbody').replaceChildren();
  try {
    const answer = await api(`restores?${filterParams(view.filter, RESTORE_FILTERS)}`);
    if (seq !== radiusSeq) return;
    expect(isObject(answer) && Array.isArray(answer.jobs) && answer.jobs.every(isObject)
      && Array.isArray(answer.restores) && answer.restores.every(isObject), 'who restored these');
    renderRadius(answer);
  } finally {
    if (seq === radiusSeq) radius.removeAttribute('aria-busy');
  }
}

function radiusFailed(err) {
  if (err instanceof SignedOut) return;
  const td = cell(`Who restored these could not be asked: ${err.message}`, 'error');
  td.colSpan = 7;
  const tr = document.createElement('tr');
  tr.append(td);
  $('radius-jobs').querySelector('tbody').replaceChildren(tr);
  report(err);
}

function renderRadius(answer) {
  const radius = $('radius');
  const truncated = answer.truncated === true;
  radius.dataset.truncated = String(truncated);
  const note = $('radius-truncated');
  note.hidden = !truncated;
  note.textContent = truncated
    ? `More restores matched than one answer holds: these are the ${formatCount(answer.restores.length)} most recent records, and jobs may be missing. Narrow the filter (a run, a time window) to see the rest.`
    : '';
  $('radius-jobs').querySelector('tbody').replaceChildren(...(answer.jobs.length ? answer.jobs.map(jobRow)
    : [emptyRow('No restore is recorded of entries written under this filter.', 7)]));
  $('radius-records').querySelector('tbody').replaceChildren(...answer.restores.map((r) => {
    const reader = isObject(r.reader) ? r.reader : {};
    const writer = isObject(r.written_by) ? r.written_by : {};
    const tr = document.createElement('tr');
    tr.dataset.testid = 'radius-record';
    tr.append(
      cell(str(r.entry_id), 'num'),
      cell(str(r.key), 'key'),
      cell(str(writer.run_id) || '—'),
      cell(`${str(reader.kind)} ${str(reader.subject)}`.trim() || '—', 'mono-wrap'),
      cell(`${str(reader.run_id) || '—'} / ${str(reader.job_id) || '—'}`),
      cell(str(reader.address) || '—', 'mono'),
      cell(formatCount(r.count), 'num'),
      cell(timeElement(r.last_restored_at)),
    );
    return tr;
  }));
}

// A restoring job (GET restores' jobs, a dry run's restored_by), in the same columns.
function jobRow(j, { links = true, testid = 'radius-job' } = {}) {
  const tr = document.createElement('tr');
  tr.dataset.testid = testid;
  tr.dataset.run = str(j.run_id);
  tr.dataset.job = str(j.job_id);
  const run = links && j.run_id ? filterLink('run_id', str(j.run_id), 'Every entry this run wrote') : (str(j.run_id) || '—');
  tr.append(
    cell(str(j.kind) || '—'),
    cell(str(j.subject) || '—', 'mono-wrap'),
    cell(run),
    cell(str(j.job_id) || '—'),
    cell(formatCount(j.entries), 'num'),
    cell(formatCount(j.restores), 'num'),
    cell(timeElement(j.last_restored_at)),
  );
  return tr;
}

function emptyRow(text, columns) {
  const td = cell(text, 'muted');
  td.colSpan = columns;
  const tr = document.createElement('tr');
  tr.append(td);
  return tr;
}

// ---- Delete, quarantine, release ------------------------------------------------------------

// What the dialog is about: one entry, the selected ones, or every entry of a filter; and, once
// the dry run has answered, what it said.
let pending = null;
let reviewSeq = 0;

const plural = (n, one, many) => `${formatCount(n)} ${n === 1 ? one : many}`;

function question(target) {
  const forGood = target.state === 'quarantined';
  if (target.kind === 'entry') {
    return forGood ? `Delete quarantined entry ${target.entries[0].key} for good?`
      : `Delete or quarantine cache entry ${target.entries[0].key}?`;
  }
  if (target.kind === 'selection') {
    const n = plural(target.entries.length, 'selected entry', 'selected entries');
    return forGood ? `Delete the ${n} for good?` : `Delete or quarantine the ${n}?`;
  }
  return `Delete or quarantine every entry with ${describeFilter(target.filter)}?`;
}

// Opens the dialog and asks the server what would go (a dry run) before anything can be done.
async function review(target) {
  const dialog = $('confirm');
  if (dialog.open) return;
  pending = { ...target, dry: null };
  const forGood = target.state === 'quarantined';
  $('confirm-text').textContent = question(target);
  const summary = $('review-summary');
  summary.textContent = 'Asking the server what this would remove (a dry run)…';
  delete summary.dataset.count;
  delete summary.dataset.bytes;
  $('review-error').textContent = '';
  $('review-note').textContent = '';
  $('review-restored').hidden = true;
  $('review-jobs').querySelector('tbody').replaceChildren();
  const del = $('confirm-delete');
  const quarantine = $('confirm-quarantine');
  del.textContent = forGood ? 'Delete for good' : 'Delete';
  del.hidden = false;
  quarantine.hidden = forGood;
  $('confirm-release').hidden = true;
  del.disabled = true;
  quarantine.disabled = true;
  dialog.returnValue = '';
  dialog.showModal();
  const seq = ++reviewSeq;
  try {
    const dry = await dryRun(target);
    if (seq !== reviewSeq) return;
    pending.dry = dry;
    renderReview(dry, target);
    del.disabled = dry.deleted === 0;
    quarantine.disabled = dry.deleted === 0;
  } catch (err) {
    if (seq !== reviewSeq || err instanceof SignedOut) return;
    summary.textContent = '';
    $('review-error').textContent = `The dry run failed, so nothing can be done from here: ${err.message}`;
  }
}

// `DELETE …&dry_run=true`: for a filter one call; for entries one call each, added up (a job
// that restored several of them counts them all).
async function dryRun(target) {
  if (target.kind === 'filter') {
    const params = filterParams(target.filter);
    params.set('dry_run', 'true');
    const dry = await api(`caches?${params}`, { method: 'DELETE' });
    expect(isDeleted(dry), 'a dry run');
    return dry;
  }
  const total = { deleted: 0, size_in_bytes: 0, ids: [], restored_by: [], gone: 0 };
  const jobs = new Map();
  for (const e of target.entries) {
    let dry;
    try {
      dry = await api(`caches/${encodeURIComponent(e.id)}?dry_run=true`, { method: 'DELETE' });
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        total.gone++;
        continue;
      }
      throw err;
    }
    expect(isDeleted(dry), 'a dry run');
    total.deleted += dry.deleted;
    total.size_in_bytes += Number(dry.size_in_bytes) || 0;
    if (Array.isArray(dry.ids)) total.ids.push(...dry.ids);
    for (const j of Array.isArray(dry.restored_by) ? dry.restored_by.filter(isObject) : []) {
      const id = JSON.stringify([j.kind, j.subject, j.run_id, j.job_id]);
      const seen = jobs.get(id);
      if (!seen) {
        jobs.set(id, { ...j, entries: Number(j.entries) || 0, restores: Number(j.restores) || 0 });
      } else {
        seen.entries += Number(j.entries) || 0;
        seen.restores += Number(j.restores) || 0;
        if (str(j.last_restored_at) > str(seen.last_restored_at)) seen.last_restored_at = j.last_restored_at;
      }
    }
  }
  total.restored_by = [...jobs.values()].sort((a, b) => str(b.last_restored_at).localeCompare(str(a.last_restored_at)));
  return total;
}

function renderReview(dry, target) {
  const summary = $('review-summary');
  summary.dataset.count = String(dry.deleted);
  summary.dataset.bytes = String(Number(dry.size_in_bytes) || 0);
  const count = document.createElement('strong');
  count.dataset.testid = 'review-count';
  count.textContent = plural(dry.deleted, 'entry', 'entries');
  const size = document.createElement('strong');
  size.dataset.testid = 'review-size';
  size.textContent = formatBytes(Number(dry.size_in_bytes) || 0);
  if (dry.deleted === 0) summary.replaceChildren('Nothing matches any more: there is nothing to remove.');
  else summary.replaceChildren('This would remove ', count, ' (', size, ').');

  const jobs = Array.isArray(dry.restored_by) ? dry.restored_by.filter(isObject) : [];
  $('review-restored').hidden = jobs.length === 0;
  $('review-jobs').querySelector('tbody').replaceChildren(...jobs.map((j) => jobRow(j, { links: false, testid: 'review-job' })));
  const notes = [];
  if (dry.deleted > 0 && jobs.length === 0) notes.push('No job is recorded as having restored them.');
  if (dry.deleted > 1000 && target.kind === 'filter') notes.push('The jobs named are those that restored the first 1,000 of them.');
  if (dry.gone) notes.push(`${plural(dry.gone, 'of them is', 'of them are')} already gone.`);
  if (dry.uploads_aborted) notes.push(`It also ends ${plural(dry.uploads_aborted, 'upload', 'uploads')} of the filter still open, so their writer cannot finalize them.`);
  if (target.state === 'quarantined') notes.push('Deleting a quarantined entry removes it and its archive for good.');
  else notes.push('Quarantine takes them out of lookups but keeps them, to download or release; Delete removes them.');
  $('review-note').textContent = notes.join(' ');
}

// A quarantined entry back into lookups, after a confirmation.
function reviewRelease(e) {
  const dialog = $('confirm');
  if (dialog.open) return;
  pending = { kind: 'release', entries: [e], state: 'quarantined', dry: null };
  reviewSeq++;
  $('confirm-text').textContent = `Release ${e.key}? Lookups will find it again.`;
  const summary = $('review-summary');
  summary.textContent = e.quarantine_reason ? `It was quarantined: ${e.quarantine_reason}` : '';
  delete summary.dataset.count;
  delete summary.dataset.bytes;
  $('review-error').textContent = '';
  $('review-restored').hidden = true;
  $('review-note').textContent = 'Release only what you have checked: every job that looks its key up may restore it.';
  $('confirm-delete').hidden = true;
  $('confirm-quarantine').hidden = true;
  const release = $('confirm-release');
  release.hidden = false;
  release.disabled = false;
  dialog.returnValue = '';
  dialog.showModal();
}

// The dialog's form has method="dialog": its buttons close it with their value (Escape gives '').
$('confirm').addEventListener('close', async () => {
  const target = pending;
  pending = null;
  reviewSeq++;
  const choice = $('confirm').returnValue;
  if (!target) return;
  try {
    if (choice === 'release' && target.kind === 'release') await release(target.entries[0]);
    else if ((choice === 'delete' || choice === 'quarantine') && target.dry) await act(target, choice === 'quarantine');
    else return;
  } catch (err) {
    report(err);
  }
  await loadEntries().catch(report);
});

async function act(target, quarantine) {
  const verb = quarantine ? 'Quarantined' : 'Deleted';
  if (target.kind === 'filter') {
    const params = filterParams(target.filter);
    if (quarantine) params.set('quarantine', 'true');
    const done = await api(`caches?${params}`, { method: 'DELETE' });
    expect(isDeleted(done), 'a deletion');
    if (quarantine && done.quarantine !== true) {
      throw new Error('the server deleted instead of quarantining (it does not know quarantine=true?)');
    }
    const differs = done.deleted !== target.dry.deleted
      ? ` The dry run counted ${formatCount(target.dry.deleted)}: entries were written or removed in between.` : '';
    setStatus(`${verb} ${plural(done.deleted, 'entry', 'entries')} (${formatBytes(done.size_in_bytes)}).${differs}`);
    return;
  }
  let count = 0;
  let bytes = 0;
  let gone = 0;
  const failed = [];
  for (const e of target.entries) {
    try {
      const done = await api(`caches/${encodeURIComponent(e.id)}${quarantine ? '?quarantine=true' : ''}`, { method: 'DELETE' });
      expect(isDeleted(done), 'a deletion');
      if (quarantine && done.quarantine !== true) {
        throw new Error('the server deleted instead of quarantining (it does not know quarantine=true?)');
      }
      count += done.deleted;
      bytes += Number(done.size_in_bytes) || 0;
    } catch (err) {
      if (err instanceof SignedOut) throw err;
      if (err instanceof ApiError && err.status === 404) gone++;
      else failed.push(`${e.key}: ${err.message}`);
    }
  }
  if (target.kind === 'entry') {
    const key = target.entries[0].key;
    if (failed.length) throw new Error(failed[0]);
    setStatus(gone ? `${key} was already gone.` : `${verb} ${key}.`);
    return;
  }
  const parts = [`${verb} ${plural(count, 'entry', 'entries')} (${formatBytes(bytes)})`];
  if (gone) parts.push(`${plural(gone, 'was', 'were')} already gone`);
  if (failed.length) parts.push(`${plural(failed.length, 'failed', 'failed')}: ${failed.join('; ')}`);
  setStatus(`${parts.join('; ')}.`, failed.length > 0);
}

async function release(e) {
  try {
    await api(`caches/${encodeURIComponent(e.id)}/release`, { method: 'POST' });
    setStatus(`Released ${e.key}: lookups find it again.`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 409) {
      setStatus(`${e.key} was not released: ${err.message}`, true);
      return;
    }
    throw err;
  }
}

route();

// ---- Write policy ---------------------------------------------------------------------------

// "; 2 writes and 1 lookup refused by the write policy", or nothing when none was.
function refusedByPolicy(t) {
  const writes = t.refused_writes || 0;
  const reads = t.refused_reads || 0;
  if (!writes && !reads) return '';
  const plural = (n, one, many) => `${formatCount(n)} ${n === 1 ? one : many}`;
  return `; ${plural(writes, 'write', 'writes')} and ${plural(reads, 'lookup', 'lookups')} refused by the write policy`;
}

// "; 3 hits served by promoted entries" (a merge queue's, a merged pull request's: what
// promotion saved), or nothing when none was.
function fromPromotion(t) {
  const n = t.promoted_hits || 0;
  if (!n) return '';
  return `; ${formatCount(n)} ${n === 1 ? 'hit' : 'hits'} served by promoted entries`;
}

async function loadPolicy() {
  renderPolicy(await api('policy'));
}

// The policy in force, and a banner when its file's last load failed or the file on disk is
// not what is in force: a freeze that did not take must not look like one that did.
function renderPolicy(p) {
  const none = !p.source;
  $('policy-none').hidden = !none;
  $('policy-facts').hidden = none;
  const attempt = p.last_attempt;
  const failed = Boolean(attempt && attempt.outcome !== 'ok');
  const differs = p.differs_from_file === true;
  const banner = $('policy-banner');
  banner.hidden = !(failed || differs);
  banner.dataset.state = failed ? 'reload-failed' : (differs ? 'file-differs' : 'ok');
  $('policy-banner-title').textContent = failed
    ? 'The last reload of the policy file failed: the rules below are still in force'
    : 'The policy file on disk is not the policy in force';
  $('policy-banner-list').replaceChildren(...(p.warnings || []).map((w) => {
    const li = document.createElement('li');
    li.textContent = w;
    return li;
  }));

  $('policy-file').textContent = p.source || '—';
  $('policy-loaded').replaceChildren(timeElement(p.loaded_at));
  const outcome = $('policy-outcome');
  outcome.dataset.outcome = attempt ? attempt.outcome : '';
  if (!attempt) {
    outcome.textContent = '—';
  } else if (failed) {
    const why = document.createElement('span');
    why.className = 'error';
    why.textContent = `: ${attempt.error || 'no reason given'}`;
    outcome.replaceChildren('Failed ', timeElement(attempt.at), why);
  } else {
    outcome.replaceChildren('Loaded ', timeElement(attempt.at));
  }
  const disk = $('policy-disk');
  if (p.differs_from_file == null) disk.textContent = 'Not known';
  else if (!differs) disk.textContent = 'The policy in force';
  else if (p.file_changed_at) disk.replaceChildren('Differs: changed ', timeElement(p.file_changed_at), ', not in force until reloaded (SIGHUP)');
  else disk.textContent = 'Differs, or cannot be read: a reload would not give the policy in force';
  $('policy-digest').textContent = p.digest || '—';

  const tbody = $('policy-rules').querySelector('tbody');
  if (p.rules.length === 0) {
    const td = cell(none ? 'No policy: every scope is read-write.' : 'The file has no rules: every scope is read-write.', 'muted');
    td.colSpan = 6;
    const tr = document.createElement('tr');
    tr.append(td);
    tbody.replaceChildren(tr);
    return;
  }
  tbody.replaceChildren(...p.rules.map((r, i) => {
    const tr = document.createElement('tr');
    tr.dataset.testid = 'policy-rule';
    const access = cell(r.access, `access access-${r.access}`);
    tr.append(
      cell(String(i + 1), 'num'),
      cell(r.line ? String(r.line) : '—', 'num'),
      cell(r.repository, 'mono'),
      cell(r.scope, 'mono'),
      access,
      cell(r.callers ? r.callers.join(', ') : 'every caller'),
    );
    return tr;
  }));
}
