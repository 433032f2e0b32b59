// client.mjs as a CommonJS entry point, as an action bundled to CommonJS starts: the runner's
// preload (NODE_OPTIONS=--require) must run before it as before an ES module. @actions/cache 6
// is an ES module, so it is imported; the 3.2.4 client (HOARD_E2E_CLIENT=3) is required.
//
//   node client.cjs save    KEY PATH...
//   node client.cjs restore KEY PATH...
'use strict';

async function main() {
  const cache = process.env.HOARD_E2E_CLIENT === '3'
    ? require('actions-cache-3')
    : await import('@actions/cache');
  const [command, key, ...paths] = process.argv.slice(2);
  if (process.env.HOARD_E2E_SHOW_ENV) console.log(`ENV ${JSON.stringify({
    module: typeof require === 'function' && typeof module === 'object' ? 'commonjs' : 'other',
    ACTIONS_RESULTS_URL: process.env.ACTIONS_RESULTS_URL,
    ACTIONS_CACHE_URL: process.env.ACTIONS_CACHE_URL,
    HOARD_ORIGINAL_ACTIONS_RESULTS_URL: process.env.HOARD_ORIGINAL_ACTIONS_RESULTS_URL,
    HOARD_ORIGINAL_ACTIONS_CACHE_URL: process.env.HOARD_ORIGINAL_ACTIONS_CACHE_URL,
  })}`);
  let result;
  if (command === 'save') {
    result = await cache.saveCache(paths, key);
  } else if (command === 'restore') {
    result = (await cache.restoreCache(paths, key, [])) ?? null;
  } else {
    console.error(`unknown command ${command}`);
    process.exit(2);
  }
  console.log(`RESULT ${JSON.stringify(result)}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
