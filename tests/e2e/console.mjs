// Works an incident in hoard's dashboard (/_hoard/) in Debian's chromium with playwright-core: opens
// a link to the entries of a poisoned run (before signing in), reloads it, asks what deleting them
// all would remove and who restored them, reads an entry's restore records and the blast radius,
// and deletes one entry through a selection. With QUARANTINE=1 it then quarantines the rest of the
// run, lists them as quarantined, downloads one's archive, releases it and deletes the other for good.
//
//   HOARD_URL=http://127.0.0.1:1234 HOARD_ADMIN_TOKEN=... POISON_RUN=run-x POISON_IDS='[1,2,3]' \
//     DELETE_ID=2 RELEASE_ID=1 QUARANTINE=1 SCREENSHOT_DIR=/tmp/shots node console.mjs
//
// POISON_IDS are the run's entries, oldest first. Uses /usr/bin/chromium, never Playwright's own
// browsers. Any failed wait throws (exit code 1); what was seen is checked by the Rust test. The last
// line is `RESULT <json>` with what was seen and the absolute paths of the screenshots.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { env, openPage } from './browser.mjs';

const base = env('HOARD_URL');
const token = env('HOARD_ADMIN_TOKEN');
const run = env('POISON_RUN');
const poisonIds = JSON.parse(env('POISON_IDS'));
const deleteId = Number(env('DELETE_ID'));
const releaseId = Number(env('RELEASE_ID'));
const quarantine = process.env.QUARANTINE === '1';
const shotDir = path.resolve(env('SCREENSHOT_DIR'));
fs.mkdirSync(shotDir, { recursive: true });
const TIMEOUT = 30_000; // chromium on a busy 2-core machine

// Retries `probe` until it returns `{ ok: true }`; on timeout, fails saying what was expected and
// what was last seen.
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
  const text = async (locator) => ((await locator.textContent()) ?? '').trim();
  const row = (id) => page.locator(`[data-testid="entry-row"][data-id="${id}"]`);
  const details = (id) => page.locator(`[data-testid="entry-details"][data-id="${id}"]`);
  const status = () => text(byTestId('status-message'));
  const dialog = byTestId('confirm-dialog');
  const shots = [];
  const shot = async (name) => {
    const file = path.join(shotDir, name);
    await page.screenshot({ path: file, fullPage: true });
    shots.push(file);
  };

  // The entries page once it shows `hash` (what the page marks as drawn): the ids listed in
  // order, and the total it states.
  const listing = async (hash) => {
    await until(`the entries page does not show ${hash}`, async () => {
      const seen = await byTestId('entries').getAttribute('data-showing');
      return { ok: seen === hash, seen: { showing: seen, status: await status() } };
    });
    return {
      ids: await page.$$eval('[data-testid="entry-row"]', (rows) => rows.map((r) => Number(r.dataset.id))),
      total: await text(byTestId('entries-total')),
      url: page.url(),
    };
  };

  // The dialog once its dry run has answered: the count and size it states, and the restoring jobs.
  const reviewed = async () => {
    await dialog.waitFor({ state: 'visible' });
    await until('the dry run did not answer in the dialog', async () => {
      const count = await byTestId('review-summary').getAttribute('data-count');
      return { ok: count !== null, seen: { summary: await text(byTestId('review-summary')), error: await text(byTestId('review-error')) } };
    });
    const summary = byTestId('review-summary');
    return {
      question: await text(page.locator('#confirm-text')),
      count: Number(await summary.getAttribute('data-count')),
      bytes: Number(await summary.getAttribute('data-bytes')),
      countText: await text(byTestId('review-count')),
      sizeText: await text(byTestId('review-size')),
      jobs: await page.$$eval('[data-testid="review-job"]', (rows) => rows.map((r) => ({
        run: r.dataset.run,
        job: r.dataset.job,
        cells: [...r.cells].map((c) => c.textContent.trim()),
      }))),
      note: await text(byTestId('review-note')),
      deleteLabel: await text(byTestId('confirm-delete')),
      quarantineShown: await byTestId('confirm-quarantine').isVisible(),
    };
  };

  // An entry's details, opened from its key, once its restore records are loaded.
  const openDetails = async (id) => {
    await row(id).getByTestId('details-button').click();
    const d = details(id);
    await d.waitFor({ state: 'visible' });
    await until(`the restore records of entry ${id} did not load`, async () => {
      const busy = await d.getByTestId('restore-section').getAttribute('aria-busy');
      const loaded = await d.locator('[data-testid="restore-records"], [data-testid="restore-records-none"], [data-testid="detail-error"]').count();
      return { ok: busy === null && loaded > 0, seen: { busy, loaded } };
    });
    const facts = {};
    for (const dd of await d.locator('dd').all()) facts[(await dd.getAttribute('data-testid')).replace(/^detail-/, '')] = await text(dd);
    return {
      facts,
      records: await d.locator('[data-testid="restore-record"]').evaluateAll((rows) => rows.map((r) => ({
        run: r.dataset.run,
        job: r.dataset.job,
        cells: [...r.cells].map((c) => c.textContent.trim()),
      }))),
      error: (await d.getByTestId('detail-error').count()) ? await text(d.getByTestId('detail-error')) : null,
    };
  };

  // 1. A link to the run's entries, opened before signing in, shows them after.
  const runView = `#entries?run_id=${encodeURIComponent(run)}&sort=created_at&direction=asc`;
  await page.goto(`${base}/_hoard/${runView}`);
  await byTestId('token-input').fill(token);
  await byTestId('signin-button').click();
  await byTestId('entries').waitFor({ state: 'visible' }).catch(() => {
    throw new Error(`the entries page did not open from the link ${runView} after signing in`);
  });
  const linked = await listing(runView);
  const form = {
    run: await byTestId('search-run').inputValue(),
    sort: await byTestId('sort').inputValue(),
    direction: await byTestId('direction').inputValue(),
    state: await byTestId('search-state').inputValue(),
  };
  await shot('console-entries.png');

  // 2. A reload keeps the view (the token stays in the tab).
  await page.reload();
  await byTestId('entries').waitFor({ state: 'visible' });
  const reloaded = await listing(runView);
  // The keys are the clients' text, never markup.
  const keys = await page.$$eval('[data-testid="details-button"]', (buttons) => buttons.map((b) => b.textContent));
  const markupRendered = await page.evaluate(() => document.getElementById('xss') !== null);

  // A misspelt filter in a link is an error, not every entry; the API's name for the page opens it too.
  await page.goto(`${base}/_hoard/#entries?runid=${encodeURIComponent(run)}`);
  const misspelt = await until('a link with a misspelt filter shows no error', async () => {
    const error = page.getByTestId('entries-error');
    const seen = (await error.count()) ? await text(error) : null;
    return { ok: seen !== null, seen, rows: await byTestId('entry-row').count() };
  });
  await page.goto(`${base}/_hoard/#/caches?run_id=${encodeURIComponent(run)}&sort=created_at&direction=asc`);
  const alias = await listing(runView);
  await page.goto(`${base}/_hoard/${runView}`);
  await listing(runView);

  // 3. What deleting every entry of the run would remove, and who restored them; cancelled.
  await byTestId('review-filter').click();
  const filterDryRun = await reviewed();
  await shot('console-dry-run.png');
  await byTestId('confirm-cancel').click();
  await dialog.waitFor({ state: 'hidden' });
  const afterCancel = await page.$$eval('[data-testid="entry-row"]', (rows) => rows.map((r) => Number(r.dataset.id)));

  // 4. Who restored the first entry, in its details.
  const restored = await openDetails(poisonIds[0]);
  await shot('console-details.png');
  await row(poisonIds[0]).getByTestId('details-button').click();

  // 5. The blast radius of the run.
  await byTestId('blast-radius-button').click();
  const radius = byTestId('blast-radius');
  await until('the blast radius did not load', async () => {
    const truncated = await radius.getAttribute('data-truncated');
    return { ok: truncated !== null, seen: { truncated, scope: await text(byTestId('radius-scope')) } };
  });
  const blastRadius = {
    scope: await text(byTestId('radius-scope')),
    truncated: await radius.getAttribute('data-truncated'),
    truncatedShown: await byTestId('radius-truncated').isVisible(),
    jobs: await page.$$eval('[data-testid="radius-job"]', (rows) => rows.map((r) => ({
      run: r.dataset.run,
      job: r.dataset.job,
      cells: [...r.cells].map((c) => c.textContent.trim()),
    }))),
    records: await page.locator('[data-testid="radius-record"]').count(),
  };
  await shot('console-radius.png');
  await byTestId('radius-close').click();

  // 6. One entry deleted through a selection, after its own dry run.
  await row(deleteId).getByTestId('select-entry').check();
  const selectedCount = await text(byTestId('selected-count'));
  await byTestId('review-selection').click();
  const selectionDryRun = await reviewed();
  await byTestId('confirm-delete').click();
  await dialog.waitFor({ state: 'hidden' });
  const deletedStatus = (await until('the status does not say the entry was deleted', async () => {
    const seen = await status();
    return { ok: seen.startsWith('Deleted 1 entry'), seen };
  })).seen;
  const afterDelete = await listing(runView);

  let quarantined = null;
  if (quarantine) {
    // 7. The rest of the run quarantined as a whole, after a dry run.
    await byTestId('review-filter').click();
    const dryRun = await reviewed();
    await byTestId('confirm-quarantine').click();
    await dialog.waitFor({ state: 'hidden' });
    const quarantineStatus = (await until('the status does not say the entries were quarantined', async () => {
      const seen = await status();
      return { ok: seen.startsWith('Quarantined'), seen };
    })).seen;
    const liveAfter = await listing(runView);

    // 8. Listed as quarantined, the state in the address; why, and its archive.
    await byTestId('search-state').selectOption('quarantined');
    const quarantinedView = `#entries?run_id=${encodeURIComponent(run)}&state=quarantined&sort=created_at&direction=asc`;
    const listed = await listing(quarantinedView);
    await shot('console-quarantined.png');
    const facts = await openDetails(releaseId);
    const [download] = await Promise.all([
      page.waitForEvent('download'),
      details(releaseId).getByTestId('download-button').click(),
    ]);
    const archive = fs.readFileSync(await download.path());
    const downloaded = {
      name: download.suggestedFilename(),
      size: archive.length,
      sha256: `sha256:${crypto.createHash('sha256').update(archive).digest('hex')}`,
    };

    // 9. Released back into lookups, after a confirmation.
    await details(releaseId).getByTestId('release-button').click();
    await dialog.waitFor({ state: 'visible' });
    const releaseQuestion = await text(page.locator('#confirm-text'));
    await byTestId('confirm-release').click();
    await dialog.waitFor({ state: 'hidden' });
    const releaseStatus = (await until('the status does not say the entry was released', async () => {
      const seen = await status();
      return { ok: seen.startsWith('Released') || seen.startsWith('Error'), seen };
    })).seen;
    const afterRelease = await listing(quarantinedView);

    // 10. The other one deleted for good.
    const rest = afterRelease.ids;
    for (const id of rest) await row(id).getByTestId('select-entry').check();
    await byTestId('review-selection').click();
    const forGood = await reviewed();
    await byTestId('confirm-delete').click();
    await dialog.waitFor({ state: 'hidden' });
    const forGoodStatus = (await until('the status does not say the entries were deleted', async () => {
      const seen = await status();
      return { ok: seen.startsWith('Deleted') || seen.startsWith('Error'), seen };
    })).seen;
    const afterForGood = await listing(quarantinedView);

    // 11. Back to live: the released entry is there.
    await byTestId('search-state').selectOption('live');
    const liveAgain = await listing(runView);
    quarantined = {
      dryRun,
      quarantineStatus,
      liveAfter,
      listed,
      facts,
      downloaded,
      releaseQuestion,
      releaseStatus,
      afterRelease,
      forGood,
      forGoodStatus,
      afterForGood,
      liveAgain,
    };
  }

  const tokenInUrl = urls.some((u) => u.includes(token) || u.includes(encodeURIComponent(token)));
  if (tokenInUrl) throw new Error('a request URL contained the admin token');
  const elsewhere = urls.filter((u) => !u.startsWith(base) && !u.startsWith('blob:'));
  if (elsewhere.length) throw new Error(`the page loaded from elsewhere: ${elsewhere.join(', ')}`);
  if (pageErrors.length) throw new Error(`the page threw: ${pageErrors.join('; ')}`);

  const result = {
    linked,
    form,
    reloaded,
    keys,
    markupRendered,
    misspelt: { error: misspelt.seen, rows: misspelt.rows },
    alias,
    filterDryRun,
    afterCancel,
    restored,
    blastRadius,
    selectedCount,
    selectionDryRun,
    deletedStatus,
    afterDelete,
    quarantined,
    screenshots: shots,
  };
  console.log(`RESULT ${JSON.stringify(result)}`);
} finally {
  await browser.close();
}
