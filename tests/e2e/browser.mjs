// What the dashboard scripts (dashboard.mjs, insight.mjs, policy.mjs) share: their settings
// from the environment, and Debian's chromium opened on one page.
import { chromium } from 'playwright-core';

/** The environment variable `name`; a script cannot run without it. */
export function env(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} must be set`);
  return value;
}

/**
 * Chromium with one 1280×800 page whose every wait gives up after `timeout` ms, and the
 * errors its scripts throw (`pageErrors`). The caller closes `browser`.
 */
export async function openPage(timeout) {
  // The machine has no internet: these switches stop chromium from waiting on the network.
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    page.setDefaultTimeout(timeout);
    const pageErrors = [];
    page.on('pageerror', (error) => pageErrors.push(error.message));
    return { browser, page, pageErrors };
  } catch (e) {
    await browser.close();
    throw e;
  }
}
