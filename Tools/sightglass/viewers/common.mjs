// Shared by the viewer checks: where the viewers are installed, headless
// Chromium, a loopback file server, and the output that
// Lib/test/support/viewers.py reads: one JSON object with ok (the file
// passed), problems (what went wrong, in words) and what the viewer showed.

import fs from 'node:fs';
import http from 'node:http';
import {createRequire} from 'node:module';
import os from 'node:os';
import path from 'node:path';

export const VIEWERS = process.env.SIGHTGLASS_VIEWERS ||
    path.join(os.homedir(), '.cache', 'sightglass', 'viewers');
export const CHROMIUM = process.env.SIGHTGLASS_CHROMIUM || '/usr/bin/chromium';

// The packages live outside the repository, so resolve them from there.
export const requireViewer = createRequire(path.join(VIEWERS, 'package.json'));

export function packageDir(name) {
  return path.join(VIEWERS, 'node_modules', name);
}

// Flags this machine needs as root with no network (see the machine notes:
// without the background-networking ones Chromium keeps dialling out).
const CHROMIUM_FLAGS = [
  '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update',
  '--disable-sync',
];

// Options take a value: --timeout SECONDS, and those named in extra (a map
// from name to default).
export function parseArgs(argv, usage, extra = {}) {
  const options = {timeout: 60, ...extra};
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    const name = argv[i].startsWith('--') ? argv[i].slice(2) : null;
    if (name === null) {
      positional.push(argv[i]);
    } else if (Object.hasOwn(options, name) && i + 1 < argv.length) {
      options[name] = argv[++i];
    } else {
      fail(`bad option ${argv[i]}\nusage: ${usage}`);
    }
  }
  options.timeout = Number(options.timeout);
  if (!(options.timeout > 0)) {
    fail(`--timeout needs a positive number of seconds\nusage: ${usage}`);
  }
  return {options, positional};
}

function fail(message) {
  process.stderr.write(message + '\n');
  process.exit(2);
}

// Run main(cleanup) under a deadline and print its result as JSON. main
// registers undo steps with cleanup.add(fn); they run in reverse order
// whatever happens, so no browser, server or directory outlives the check.
// A result with ok: false is a verdict on the file; an exception here is a
// fault of the harness, and exits non-zero.
export async function run(main, timeoutSeconds) {
  const steps = [];
  const cleanup = {add: fn => steps.push(fn)};
  const started = performance.now();
  let timer;
  const deadline = new Promise(resolve => {
    timer = setTimeout(() => resolve({
      ok: false,
      problems: [`timed out after ${timeoutSeconds} s`],
    }), timeoutSeconds * 1000);
  });
  let result;
  let exitCode = 0;
  try {
    const work = main(cleanup);
    // Once the deadline has passed, how the work then fails is moot.
    work.catch(() => {});
    result = await Promise.race([work, deadline]);
  } catch (e) {
    process.stderr.write(`${e?.stack || e}\n`);
    exitCode = 1;
  } finally {
    clearTimeout(timer);
    for (const step of steps.reverse()) {
      try {
        await step();
      } catch (e) {
        process.stderr.write(`cleanup: ${e?.stack || e}\n`);
      }
    }
  }
  // Whatever a viewer left scheduled must not keep us alive.
  if (result) {
    result.seconds = Math.round((performance.now() - started) / 10) / 100;
    process.stdout.write(JSON.stringify(result) + '\n',
                         () => process.exit(exitCode));
  } else {
    process.exit(exitCode);
  }
}

export function makeTempDir(cleanup) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sightglass-viewer-'));
  cleanup.add(() => fs.rmSync(dir, {recursive: true, force: true}));
  return dir;
}

// A fresh profile directory per run keeps runs independent of each other.
export async function launchChromium(cleanup, viewport) {
  const {chromium} = requireViewer('playwright-core');
  const context = await chromium.launchPersistentContext(makeTempDir(cleanup), {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_FLAGS,
    viewport,
  });
  cleanup.add(() => context.close());
  // The run's own deadline bounds every wait, and says so in the verdict.
  context.setDefaultTimeout(0);
  return context;
}

// Collect what a page reports about itself while it runs.
export function watchPage(page) {
  const seen = {console_errors: [], page_errors: [], dialogs: []};
  page.on('console', message => {
    if (message.type() === 'error') {
      seen.console_errors.push(message.text());
    }
  });
  page.on('pageerror', error => seen.page_errors.push(String(error)));
  page.on('dialog', dialog => {
    seen.dialogs.push(dialog.message());
    dialog.dismiss().catch(() => {});
  });
  return seen;
}

export function pageProblems(seen) {
  return [
    ...seen.page_errors.map(error => `page error: ${error}`),
    ...seen.console_errors.map(error => `console error: ${error}`),
  ];
}

const CONTENT_TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript',
  '.mjs': 'text/javascript',
  '.css': 'text/css',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.woff2': 'font/woff2',
  '.txt': 'text/plain; charset=utf-8',
};

// Serve files on 127.0.0.1 at a free port. routes maps a URL prefix to a
// directory, or an exact URL path to one file; nothing outside them is
// reachable. Resolves to the base URL.
export function serveFiles(cleanup, routes) {
  const server = http.createServer((request, response) => {
    const file = resolveRoute(routes, request.url);
    if (request.method !== 'GET' || !file) {
      response.writeHead(404).end();
      return;
    }
    fs.readFile(file, (error, data) => {
      if (error) {
        response.writeHead(404).end();
        return;
      }
      const type = CONTENT_TYPES[path.extname(file)] ||
          'application/octet-stream';
      response.writeHead(200, {'Content-Type': type}).end(data);
    });
  });
  cleanup.add(() => new Promise(resolve => {
    server.closeAllConnections();
    server.close(() => resolve());
  }));
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      resolve(`http://127.0.0.1:${server.address().port}`);
    });
  });
}

function resolveRoute(routes, url) {
  let urlPath;
  try {
    urlPath = decodeURIComponent(new URL(url, 'http://x').pathname);
  } catch {
    return null;
  }
  for (const [prefix, target] of Object.entries(routes)) {
    if (!prefix.endsWith('/')) {
      if (urlPath === prefix) {
        return target;
      }
      continue;
    }
    if (!urlPath.startsWith(prefix)) {
      continue;
    }
    const rest = urlPath.slice(prefix.length) || 'index.html';
    const file = path.resolve(target, rest);
    if (file.startsWith(path.resolve(target) + path.sep)) {
      return file;
    }
  }
  return null;
}

// Abort every request that does not go to allowed(url), and list them:
// the checked pages must work offline.
export async function blockOtherRequests(page, allowed) {
  const blocked = [];
  await page.route('**/*', route => {
    const url = route.request().url();
    if (allowed(url)) {
      return route.continue();
    }
    blocked.push(url);
    return route.abort();
  });
  return blocked;
}
