// Open a self-contained HTML page (a flame graph a profiler wrote, say) in
// headless Chromium, as a user opening the file would, and report what it
// shows.
//
//   node page.mjs [--timeout SECONDS] [--wait-for SELECTOR] PAGE
//
// The page is loaded from its file:// URL; any other request is refused
// and counts against the page, which must work offline and alone. After
// the load event (and SELECTOR appearing, if given) the page's text is read.
//
// Prints {ok, problems, title, text, console_errors, page_errors, dialogs,
// blocked_requests, seconds}: ok when the page loaded without an error, a
// console error or a request elsewhere.

import fs from 'node:fs';
import path from 'node:path';
import {pathToFileURL} from 'node:url';

import {
  blockOtherRequests, launchChromium, pageProblems, parseArgs, run,
  watchPage,
} from './common.mjs';

const USAGE = 'page.mjs [--timeout SECONDS] [--wait-for SELECTOR] PAGE';
const {options, positional} = parseArgs(
    process.argv.slice(2), USAGE, {'wait-for': null});
if (positional.length !== 1) {
  process.stderr.write(`usage: ${USAGE}\n`);
  process.exit(2);
}
const file = path.resolve(positional[0]);

run(async cleanup => {
  if (!fs.existsSync(file)) {
    return {ok: false, problems: [`no such file: ${file}`]};
  }
  const url = pathToFileURL(file).href;
  const context = await launchChromium(cleanup, {width: 1280, height: 1024});
  const page = context.pages()[0] || await context.newPage();
  const seen = watchPage(page);
  const blocked = await blockOtherRequests(page, request => request === url);
  const result = {ok: false, problems: [], title: null, text: null};
  await page.goto(url, {waitUntil: 'load'});
  if (options['wait-for']) {
    await page.waitForSelector(options['wait-for'], {state: 'attached'});
  }
  // Let work the page queued on load run before reading it.
  await page.evaluate(() => new Promise(
      resolve => requestAnimationFrame(() => setTimeout(resolve, 0))));
  result.title = await page.title();
  result.text = await page.evaluate(() => document.body?.innerText ?? '');
  Object.assign(result, seen, {blocked_requests: blocked});
  result.problems.push(
      ...pageProblems(seen),
      ...blocked.map(request => `the page requested ${request}`));
  result.ok = result.problems.length === 0;
  return result;
}, options.timeout);
