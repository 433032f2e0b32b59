// Reads hoard's insight charts (/_hoard/) in Debian's chromium with playwright-core: signs in, reads
// every chart of the overview for 24 hours, switches the period with the keyboard (7 and 30 days),
// sorts the family table, opens REPOSITORY's page from the top repositories and reads its charts.
//
//   HOARD_URL=http://127.0.0.1:1234 HOARD_ADMIN_TOKEN=... REPOSITORY=octo/name SCREENSHOT_DIR=/tmp/shots \
//     node insight.mjs
//
// Uses /usr/bin/chromium, never Playwright's own browsers. Any failed check throws (exit code 1).
// The last line is `RESULT <json>`: what each chart drew (its points' data-* attributes), the
// family table's rows, and the absolute paths of insight-overview.png and insight-repository.png.
import fs from 'node:fs';
import path from 'node:path';
import { env, openPage } from './browser.mjs';

const base = env('HOARD_URL');
const token = env('HOARD_ADMIN_TOKEN');
const repository = env('REPOSITORY');
const shotDir = path.resolve(env('SCREENSHOT_DIR'));
fs.mkdirSync(shotDir, { recursive: true });
const TIMEOUT = 30_000; // a first render of every chart in chromium on a busy 2-core machine
const CHARTS = ['chart-hit-ratio', 'chart-lookups', 'chart-evictions', 'chart-stored-family', 'chart-stored-class'];

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

// Everything the charts and the family table show, as data: each point's data-* attributes,
// each chart's legend and numbers-table rows, each family row's cells.
function readInsight() {
  const all = (sel, root = document) => [...root.querySelectorAll(sel)];
  const charts = {};
  for (const fig of all('#insight figure.chart')) {
    const svgEl = fig.querySelector('.plot svg');
    charts[fig.dataset.testid] = {
      points: all('[data-point]', fig).map((g) => {
        const { point, ...data } = g.dataset;
        return data;
      }),
      // The bucket labels under a time chart, or the labels beside bars.
      labels: all('.axis text[text-anchor="middle"], .bar-label', fig).map((t) => t.textContent),
      legend: all('.legend li', fig).map((li) => li.textContent.trim()),
      numberRows: all('.numbers tbody tr', fig).map((tr) => all('td', tr).map((td) => td.textContent.trim())),
      ariaLabel: svgEl ? svgEl.getAttribute('aria-label') : null,
      note: fig.querySelector('[data-role="note"]').textContent,
    };
  }
  const table = document.querySelector('[data-testid="family-table"]');
  const families = all('[data-testid="family-row"]', table).map((tr) => {
    const values = {};
    const text = {};
    for (const td of all('td', tr)) {
      text[td.dataset.col] = td.textContent.trim();
      if (td.dataset.value !== undefined) values[td.dataset.col] = td.dataset.value === '' ? null : Number(td.dataset.value);
    }
    return {
      family: tr.dataset.family,
      scope_class: tr.dataset.scopeClass,
      repository: tr.dataset.repository,
      values,
      text,
      sparkline: all('[data-testid="sparkline"] [data-point]', tr).map((g) => Number(g.dataset.value)),
    };
  });
  const sort = all('th[aria-sort]', table).map((th) => [th.textContent.replace(/[▲▼]/g, '').trim(), th.getAttribute('aria-sort')]);
  return {
    charts,
    families,
    sort: Object.fromEntries(sort),
    summary: document.querySelector('[data-testid="insight-summary"]').textContent,
  };
}

const { browser, page, pageErrors } = await openPage(TIMEOUT);
try {
  const requests = [];
  page.on('request', (request) => requests.push(new URL(request.url())));
  const byTestId = (id) => page.getByTestId(id);

  // Waits until the charts show `repo` ('' for the whole server) over `period`, then reads them.
  const showing = async (repo, period) => {
    const want = `${repo}|${period}`;
    await until(`the charts did not come to show "${want}"`, async () => {
      const seen = await page.evaluate(() => document.getElementById('insight').dataset.showing ?? null);
      return { ok: seen === want, seen };
    });
    return page.evaluate(readInsight);
  };

  await page.goto(`${base}/_hoard/`);
  await byTestId('token-input').fill(token);
  await byTestId('signin-button').click();
  await byTestId('overview').waitFor({ state: 'visible' });

  // 1. The whole server over 24 hours.
  const overview = await showing('', '24h');
  if (!(await byTestId('insight').isVisible())) throw new Error('the insight section is not visible on the overview');

  // 2. The family table sorts by its header buttons: Misses (the default, descending) turns
  //    round on a click; Lookups is chosen from the keyboard.
  await byTestId('sort-misses').click();
  const missesAscending = await page.evaluate(readInsight);
  await byTestId('sort-lookups').focus();
  await page.keyboard.press('Enter');
  const lookupsDescending = await page.evaluate(readInsight);
  const focusedAfterSort = await page.evaluate(() => document.activeElement?.dataset.testid ?? null);
  await byTestId('sort-misses').click(); // back to the most misses first for the screenshot
  const overviewPng = path.join(shotDir, 'insight-overview.png');
  await page.screenshot({ path: overviewPng, fullPage: true });

  // 3. The period from the keyboard: the radio group moves with the arrow keys.
  await byTestId('period-24h').focus();
  await page.keyboard.press('ArrowRight');
  const week = await showing('', '7d');
  await page.keyboard.press('ArrowRight');
  const month = await showing('', '30d');
  await byTestId('period-24h').check();
  await showing('', '24h');

  // 4. A repository's page, from its name in the top repositories.
  await page.locator('[data-testid="top-repositories"] [data-testid="repo-link"]', { hasText: repository }).click();
  await byTestId('repository').waitFor({ state: 'visible' });
  const repositoryView = await showing(repository, '24h');
  const repositoryName = (await byTestId('repository-name').textContent()).trim();
  if (!(await byTestId('insight').isVisible())) throw new Error('the insight section is not visible on the repository page');
  if (await byTestId('overview').isVisible()) throw new Error('the overview is still shown on the repository page');
  // Numbers as text: the lookups chart's table opens from its summary.
  await byTestId('chart-lookups').locator('summary').click();
  const numbersVisible = await byTestId('chart-lookups').locator('.numbers table').isVisible();
  await byTestId('chart-lookups').locator('summary').click();
  const repositoryPng = path.join(shotDir, 'insight-repository.png');
  await page.screenshot({ path: repositoryPng, fullPage: true });

  // Its entries are one click further.
  await byTestId('repository-entries').click();
  await byTestId('entries').waitFor({ state: 'visible' });
  const entriesFilter = await byTestId('search-repository').inputValue();

  if (pageErrors.length) throw new Error(`the page threw: ${pageErrors.join('; ')}`);
  const elsewhere = requests.filter((u) => u.origin !== new URL(base).origin).map(String);
  if (elsewhere.length) throw new Error(`the page loaded from elsewhere: ${elsewhere.join(', ')}`);
  const statsQueries = requests
    .filter((u) => u.pathname.startsWith('/_hoard/api/v1/stats'))
    .map((u) => `${u.pathname.slice('/_hoard/api/v1/'.length)}?${u.searchParams}`);

  const result = {
    overview,
    missesAscending,
    lookupsDescending,
    focusedAfterSort,
    week,
    month,
    repository: repositoryView,
    repositoryName,
    numbersVisible,
    entriesFilter,
    statsQueries,
    charts: CHARTS,
    screenshots: [overviewPng, repositoryPng],
  };
  console.log(`RESULT ${JSON.stringify(result)}`);
} finally {
  await browser.close();
}
