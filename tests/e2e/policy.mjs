// Drives hoard's dashboard (/_hoard/) in Debian's chromium with playwright-core: signs in, opens
// the Policy page and reads what it shows: the rules in force, the file, the last load and the
// banner a failed reload or a changed file raises.
//
//   HOARD_URL=http://127.0.0.1:1234 HOARD_ADMIN_TOKEN=... SCREENSHOT_DIR=/tmp/shots \
//     SCREENSHOT_NAME=policy-failed.png node policy.mjs
//
// Uses /usr/bin/chromium, never Playwright's own browsers. Any failed check throws (exit code 1).
// The last line is `RESULT <json>` with what was seen and the absolute path of the screenshot.
import fs from 'node:fs';
import path from 'node:path';
import { env, openPage } from './browser.mjs';

const base = env('HOARD_URL');
const token = env('HOARD_ADMIN_TOKEN');
const shotDir = path.resolve(env('SCREENSHOT_DIR'));
const shotName = env('SCREENSHOT_NAME');
fs.mkdirSync(shotDir, { recursive: true });
const TIMEOUT = 10_000;

const { browser, page, pageErrors } = await openPage(TIMEOUT);
try {
  const byTestId = (id) => page.getByTestId(id);
  const text = async (id) => ((await byTestId(id).textContent()) ?? '').trim();

  await page.goto(`${base}/_hoard/`);
  await byTestId('token-input').fill(token);
  await byTestId('signin-button').click();
  await byTestId('overview').waitFor({ state: 'visible' }).catch(() => {
    throw new Error('the overview did not appear after signing in');
  });

  // The page is reached from the navigation, like every other.
  const policyAnswer = page.waitForResponse((r) => new URL(r.url()).pathname === '/_hoard/api/v1/policy');
  await byTestId('nav-policy').click();
  await policyAnswer;
  await byTestId('policy').waitFor({ state: 'visible' }).catch(() => {
    throw new Error('the policy page did not appear after clicking nav-policy');
  });
  if (await byTestId('overview').isVisible()) throw new Error('the overview is still shown on the policy page');
  const current = await byTestId('nav-policy').getAttribute('aria-current');
  if (current !== 'page') throw new Error(`nav-policy is not marked as the current page (${current})`);
  const rows = byTestId('policy-rule');
  await rows.first().waitFor({ state: 'visible' }).catch(() => {
    throw new Error('the policy page shows no rule');
  });

  const rules = [];
  for (let i = 0; i < await rows.count(); i++) {
    const cells = await rows.nth(i).locator('td').allTextContents();
    rules.push(cells.map((c) => c.trim()));
  }
  const banner = byTestId('policy-banner');
  const bannerShown = await banner.isVisible();
  const seen = {
    rules,
    file: await text('policy-file'),
    outcome: await text('policy-outcome'),
    outcomeState: await byTestId('policy-outcome').getAttribute('data-outcome'),
    disk: await text('policy-disk'),
    digest: await text('policy-digest'),
    banner: bannerShown ? await banner.textContent() : null,
    bannerState: await banner.getAttribute('data-state'),
    bannerRole: await banner.getAttribute('role'),
  };
  const shot = path.join(shotDir, shotName);
  await page.screenshot({ path: shot, fullPage: true });
  if (pageErrors.length) throw new Error(`the page threw: ${pageErrors.join('; ')}`);
  console.log(`RESULT ${JSON.stringify({ ...seen, screenshot: shot })}`);
} finally {
  await browser.close();
}
