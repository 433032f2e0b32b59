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
async function api(path, options = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) {
    showSignIn('');
    throw new SignedOut();
  }
  const res = await fetch(API + path, {
    ...options,
    cache: 'no-store',
    headers: { Authorization: `Bearer ${token}`, Accept: 'application/json' },
  });
  if (res.status === 401) {
    showSignIn(REFUSED);
    throw new SignedOut();
  }
  const body = await res.json().catch(() => null);
  if (!res.ok) throw new ApiError(res.status, (body && body.message) || `HTTP ${res.status}`);
  return body;
}

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
  $('entries').hidden = true;
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

function currentView() {
  return location.hash === '#entries' ? 'entries' : 'overview';
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
  $('entries').hidden = view !== 'entries';
  document.querySelectorAll('#nav a').forEach((a) => {
    if (a.dataset.view === view) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  });
  if (view === 'overview') loadOverview().catch(report);
  else loadEntries().catch(report);
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
    // The name opens the entry browser filtered to that repository.
    const link = document.createElement('button');
    link.type = 'button';
    link.className = 'link';
    link.textContent = label;
    link.title = `Show the entries of ${label}`;
    link.addEventListener('click', () => showRepository(name));
    const size = quota
      ? `${formatBytes(r.active_caches_size_in_bytes)} (${formatRatio(r.active_caches_size_in_bytes / quota)} of quota)`
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
  const form = $('search');
  form.reset();
  $('search-repository').value = name;
  query = readSearch();
  cursor = null;
  location.hash = '#entries';
}

// ---- Entries --------------------------------------------------------------------------------

// The search in force (what was submitted, not what is being typed) and the page shown.
let query = null;
let cursor = null;
let loadSeq = 0; // only the newest response is drawn when searches overlap

function readSearch() {
  const q = {};
  for (const name of ['key', 'ref', 'repository', 'run_id', 'sort', 'direction']) {
    const value = $('search').elements[name].value.trim();
    if (value) q[name] = value;
  }
  return q;
}

async function loadEntries() {
  if (!query) query = readSearch();
  const params = new URLSearchParams({ ...query, per_page: String(PER_PAGE) });
  if (cursor) params.set('cursor', cursor);
  const seq = ++loadSeq;
  const page = await api(`caches?${params}`);
  if (seq !== loadSeq) return;
  // A refresh after deleting the last entry of a later page: go back to the first page.
  if (page.actions_caches.length === 0 && cursor) {
    cursor = null;
    return loadEntries();
  }
  renderEntries(page);
}

function renderEntries(page) {
  const total = page.total_count;
  $('entries-total').textContent = `${formatCount(total)} ${total === 1 ? 'entry' : 'entries'}`;
  const tbody = $('entries-table').querySelector('tbody');
  if (page.actions_caches.length === 0) {
    const td = cell('No cache entries match.', 'muted');
    td.colSpan = 9;
    const tr = document.createElement('tr');
    tr.append(td);
    tbody.replaceChildren(tr);
  } else {
    tbody.replaceChildren(...page.actions_caches.flatMap((e) => {
      const details = detailsRow(e);
      return [entryRow(e, details), details];
    }));
  }
  const next = $('next-page');
  next.hidden = page.next_cursor == null;
  next.dataset.cursor = page.next_cursor || '';
  $('first-page').hidden = cursor == null;
}

// Who wrote the entry and its digest, in a row under it that its key's button opens.
function detailsRow(e) {
  const tr = document.createElement('tr');
  tr.className = 'details';
  tr.dataset.testid = 'entry-details';
  tr.dataset.id = String(e.id);
  tr.hidden = true;
  const list = document.createElement('dl');
  const w = e.written_by;
  const fields = w
    ? [['Written by', w.kind], ['Issuer', w.issuer], ['Subject', w.subject], ['Run', w.run_id],
      ['Job', w.job_id], ['Address', w.address]]
    : [['Written by', 'not recorded (saved before hoard kept writers)']];
  fields.push(['Written at', e.created_at], ['Digest', e.digest || '']);
  for (const [name, value] of fields) {
    const dt = document.createElement('dt');
    dt.textContent = name;
    const dd = document.createElement('dd');
    dd.textContent = value || '—';
    dd.dataset.testid = `detail-${name.toLowerCase().replace(/ /g, '-')}`;
    list.append(dt, dd);
  }
  const td = cell(list);
  td.colSpan = 9;
  tr.append(td);
  return tr;
}

function entryRow(e, details) {
  const tr = document.createElement('tr');
  tr.dataset.testid = 'entry-row';
  tr.dataset.id = String(e.id);

  const key = document.createElement('button');
  key.type = 'button';
  key.className = 'link';
  key.textContent = e.key;
  key.dataset.testid = 'details-button';
  key.setAttribute('aria-expanded', 'false');
  key.addEventListener('click', () => {
    details.hidden = !details.hidden;
    key.setAttribute('aria-expanded', String(!details.hidden));
  });

  const version = document.createElement('span');
  version.textContent = e.version.length > 10 ? `${e.version.slice(0, 8)}…` : e.version;
  version.title = e.version;

  const del = document.createElement('button');
  del.type = 'button';
  del.className = 'danger small';
  del.textContent = 'Delete';
  del.dataset.testid = 'delete-button';
  del.setAttribute('aria-label', `Delete ${e.key}`);
  del.addEventListener('click', () => confirmDelete(e));

  tr.append(
    cell(key, 'key'),
    cell(e.repository || `id ${e.repository_id}`),
    cell(e.ref, 'ref'),
    cell(version, 'mono'),
    cell(formatBytes(e.size_in_bytes), 'num'),
    cell(timeElement(e.created_at)),
    cell(timeElement(e.last_accessed_at)),
    cell(formatCount(e.hits), 'num'),
    cell(del),
  );
  return tr;
}

$('search').addEventListener('submit', (event) => {
  event.preventDefault();
  query = readSearch();
  cursor = null;
  setStatus('');
  loadEntries().catch(report);
});

$('next-page').addEventListener('click', () => {
  cursor = $('next-page').dataset.cursor || null;
  loadEntries().then(() => $('entries-title').scrollIntoView()).catch(report);
});

$('first-page').addEventListener('click', () => {
  cursor = null;
  loadEntries().catch(report);
});

// ---- Delete ---------------------------------------------------------------------------------

let pendingDelete = null;

function confirmDelete(entry) {
  pendingDelete = entry;
  $('confirm-text').textContent = `Delete cache entry ${entry.key}?`;
  $('confirm').returnValue = '';
  $('confirm').showModal();
}

// The dialog's form has method="dialog": its buttons close it with their value (Escape gives '').
$('confirm').addEventListener('close', async () => {
  const entry = pendingDelete;
  pendingDelete = null;
  if (!entry || $('confirm').returnValue !== 'delete') return;
  try {
    await api(`caches/${encodeURIComponent(entry.id)}`, { method: 'DELETE' });
    setStatus(`Deleted ${entry.key}.`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) setStatus(`${entry.key} was already gone.`);
    else return report(err);
  }
  await loadEntries().catch(report);
});

route();
