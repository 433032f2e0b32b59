// Drives hoard's dashboard (/_hoard/) in Debian's chromium with playwright-core: signs in (first
// with a wrong token), reads the overview, finds EXPECT_KEY in the entry browser and deletes it.
//
//   HOARD_URL=http://127.0.0.1:1234 HOARD_ADMIN_TOKEN=... EXPECT_KEY=... SCREENSHOT_DIR=/tmp/shots \
//     node dashboard.mjs
//
// Uses /usr/bin/chromium, never Playwright's own browsers. Any failed check throws (exit code 1).
// The last line is `RESULT <json>` with what was seen, and the absolute paths of overview.png and
// entries.png written into SCREENSHOT_DIR.
import fs from 'node:fs';
import path from 'node:path';
import { env, openPage } from './browser.mjs';

const base = env('HOARD_URL');
const token = env('HOARD_ADMIN_TOKEN');
const key = env('EXPECT_KEY');
const shotDir = path.resolve(env('SCREENSHOT_DIR'));
fs.mkdirSync(shotDir, { recursive: true });
const wrongToken = `${token}-wrong`;
const REFUSED = 'The admin token was refused.';
const TIMEOUT = 10_000;

// Retries `probe` until it returns a truthy value; on timeout, fails saying what was expected
// and what was last seen.
async function until(what, probe) {
  const deadline = Date.now() + TIMEOUT;
  let last;
  for (;;) {
    last = await probe();
    if (last.ok) return last;
    if (Date.now() > deadline) throw new Error(`${what}; last seen: ${JSON.stringify(last.seen)}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

const { browser, page, pageErrors } = await openPage(TIMEOUT);
try {
  const urls = [];
  page.on('request', (request) => urls.push(request.url()));
  const byTestId = (id) => page.getByTestId(id);
  const text = async (id) => (await byTestId(id).textContent()) ?? '';
  // Waits for the entry list the page asks for next, for a click that triggers it.
  const cachesResponse = () => page.waitForResponse((r) => new URL(r.url()).pathname === '/_hoard/api/v1/caches');

  // 1. Sign in, wrong token first.
  await page.goto(`${base}/_hoard/`);
  await byTestId('token-input').fill(wrongToken);
  await byTestId('signin-button').click();
  await until(`the refusal message "${REFUSED}" did not appear in the sign-in form`, async () => {
    const seen = await text('signin-form');
    return { ok: seen.includes(REFUSED), seen };
  });
  if (!(await byTestId('signin-form').isVisible())) throw new Error('the sign-in form went away after a wrong token');
  if (await byTestId('overview').isVisible()) throw new Error('the overview is shown after a wrong token');

  await byTestId('token-input').fill(token);
  await byTestId('signin-button').click();
  await byTestId('overview').waitFor({ state: 'visible' }).catch(() => {
    throw new Error('the overview did not appear after signing in with the right token');
  });
  await until('stat-entries does not show a number >= 1', async () => {
    const seen = await text('stat-entries');
    return { ok: Number(seen.replace(/[^0-9]/g, '')) >= 1 && /\d/.test(seen), seen };
  });
  const repoRows = page.locator('[data-testid="top-repositories"] tbody tr');
  await until('the top repositories table has no row', async () => {
    const seen = await repoRows.count();
    return { ok: seen >= 1, seen };
  });
  // Bytes per scope class, in the first (the only) repository's row.
  const firstRepo = repoRows.first();
  const repoClasses = {
    branches: (await firstRepo.getByTestId('repo-branch-bytes').textContent()) ?? '',
    prsAndTags: (await firstRepo.getByTestId('repo-pr-tag-bytes').textContent()) ?? '',
  };
  if (await byTestId('signin-form').isVisible()) throw new Error('the sign-in form is still shown after signing in');
  const stored = await page.evaluate(() => ({ local: JSON.stringify(localStorage), session: JSON.stringify(sessionStorage) }));
  if (stored.local.includes(token)) throw new Error('the token is in localStorage');
  if (!stored.session.includes(token)) throw new Error('the token is not in sessionStorage');
  const overviewPng = path.join(shotDir, 'overview.png');
  await page.screenshot({ path: overviewPng, fullPage: true });

  // 2. Find the entry by a prefix of its key.
  await byTestId('nav-entries').click();
  await byTestId('entries').waitFor({ state: 'visible' }).catch(() => {
    throw new Error('the entries view did not appear after clicking nav-entries');
  });
  await byTestId('search-key').fill(key.slice(0, 5));
  await Promise.all([cachesResponse(), byTestId('search-button').click()]);
  // The row whose key cell is exactly EXPECT_KEY (others may share its prefix).
  const row = byTestId('entry-row').filter({ has: page.getByRole('cell', { name: key, exact: true }) });
  await until(`no entry row with key ${key} after searching for the prefix ${key.slice(0, 5)}`, async () => {
    const seen = await row.count();
    return { ok: seen === 1, seen: { rows: seen, total: await text('entries-total') } };
  });
  const deletedId = Number(await row.getAttribute('data-id'));
  if (!Number.isInteger(deletedId)) throw new Error(`the entry row has no numeric data-id`);
  // Who wrote it: the key opens the entry's details.
  const details = page.locator(`[data-testid="entry-details"][data-id="${deletedId}"]`);
  await row.getByTestId('details-button').click();
  await details.waitFor({ state: 'visible' }).catch(() => {
    throw new Error('the entry details did not open on clicking its key');
  });
  const writtenBy = {};
  for (const name of ['written-by', 'subject', 'run', 'job', 'address', 'digest']) {
    writtenBy[name] = (await details.getByTestId(`detail-${name}`).textContent()).trim();
  }
  const entriesPng = path.join(shotDir, 'entries.png');
  await page.screenshot({ path: entriesPng, fullPage: true });

  // 3. Delete it: cancel once, then confirm.
  const dialog = byTestId('confirm-dialog');
  await row.getByTestId('delete-button').click();
  await dialog.waitFor({ state: 'visible' }).catch(() => {
    throw new Error('the confirmation dialog did not open on Delete');
  });
  const question = await dialog.textContent();
  if (!question.includes(key)) throw new Error(`the confirmation dialog does not show the key: ${question}`);
  await byTestId('confirm-cancel').click();
  await dialog.waitFor({ state: 'hidden' }).catch(() => {
    throw new Error('the confirmation dialog stayed open after Cancel');
  });
  if ((await row.count()) !== 1) throw new Error('the entry row went away after Cancel');

  await row.getByTestId('delete-button').click();
  await dialog.waitFor({ state: 'visible' });
  await Promise.all([cachesResponse(), byTestId('confirm-delete').click()]);
  await until(`the status message does not say "Deleted ${key}."`, async () => {
    const seen = await text('status-message');
    return { ok: seen.includes(`Deleted ${key}.`), seen };
  });
  const deletedRow = page.locator(`[data-testid="entry-row"][data-id="${deletedId}"]`);
  await until(`the deleted row (id ${deletedId}) is still listed after the refresh`, async () => {
    const seen = await deletedRow.count();
    return { ok: seen === 0, seen };
  });

  await byTestId('search-key').fill(key);
  await Promise.all([cachesResponse(), byTestId('search-key').press('Enter')]);
  const rowsAfterDelete = await until(`searching for ${key} after deleting it still lists rows or not "0 entries"`, async () => {
    const rows = await byTestId('entry-row').count();
    const total = (await text('entries-total')).trim();
    return { ok: rows === 0 && total === '0 entries', seen: { rows, total }, rows };
  }).then((r) => r.rows);

  // Sign out: the form comes back and the token is gone from the tab.
  await byTestId('signout-button').click();
  await byTestId('signin-form').waitFor({ state: 'visible' }).catch(() => {
    throw new Error('the sign-in form did not come back after Sign out');
  });
  if ((await page.evaluate(() => JSON.stringify(sessionStorage))).includes(token)) {
    throw new Error('the token is still in sessionStorage after Sign out');
  }

  // 4. The token (right or wrong) never went into a URL.
  const tokenInUrl = urls.some((u) => [token, wrongToken].some((t) => u.includes(t) || u.includes(encodeURIComponent(t))));
  if (tokenInUrl) throw new Error('a request URL contained the admin token');
  if (pageErrors.length) throw new Error(`the page threw: ${pageErrors.join('; ')}`);

  // 5.
  const result = {
    signedIn: true,
    sawEntry: true,
    deletedId,
    writtenBy,
    rowsAfterDelete,
    repoClasses,
    tokenInUrl,
    screenshots: [overviewPng, entriesPng],
  };
  console.log(`RESULT ${JSON.stringify(result)}`);
} finally {
  await browser.close();
}
