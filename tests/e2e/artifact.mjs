// Drives the real @actions/artifact client against ACTIONS_RESULTS_URL (with
// ACTIONS_RUNTIME_TOKEN), as actions/upload-artifact and download-artifact do.
//
//   node artifact.mjs upload NAME ROOT FILE...
//   node artifact.mjs list
//   node artifact.mjs download ID PATH
//
// The last line is `RESULT <json>` with what the call returned.
import { DefaultArtifactClient } from '@actions/artifact';

const client = new DefaultArtifactClient();
const [command, ...args] = process.argv.slice(2);
let result;
if (command === 'upload') {
  const [name, root, ...files] = args;
  result = await client.uploadArtifact(name, files, root);
} else if (command === 'list') {
  result = await client.listArtifacts();
} else if (command === 'download') {
  const [id, path] = args;
  result = await client.downloadArtifact(Number(id), { path });
} else {
  console.error(`unknown command ${command}`);
  process.exit(2);
}
console.log(`RESULT ${JSON.stringify(result)}`);
