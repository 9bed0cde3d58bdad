// Load a profile into speedscope's own built app in headless Chromium and
// report what it shows.
//
//   node speedscope.mjs [--timeout SECONDS] PROFILE
//
// speedscope is served from its npm release directory on loopback with the
// profile beside it, and opened with #profileURL=..., its documented way of
// loading a profile from a URL; the file name is kept because speedscope
// picks some importers by extension. speedscope reports the outcome on its
// console ("import: N ms" from console.timeEnd once imported, "Failed to
// load format" when an importer threw) or in an alert (format not
// recognised, empty profile). After an import the sandwich view lists the
// frames of the profile on screen; pressing "n" moves to the next profile
// (one per thread), as a user would.
//
// Prints {ok, problems, imported, name, profiles: [{name, frames: [{name,
// file, total, self}]}], console_errors, page_errors, dialogs,
// blocked_requests, seconds}: ok when speedscope imported the file and the
// page reported no error; problems says what went wrong otherwise.

import fs from 'node:fs';
import path from 'node:path';

import {
  blockOtherRequests, launchChromium, packageDir, pageProblems, parseArgs,
  run, serveFiles, watchPage,
} from './common.mjs';

const {options, positional} = parseArgs(
    process.argv.slice(2), 'speedscope.mjs [--timeout SECONDS] PROFILE');
if (positional.length !== 1) {
  process.stderr.write('usage: speedscope.mjs [--timeout SECONDS] PROFILE\n');
  process.exit(2);
}
const profile = path.resolve(positional[0]);
const release = path.join(packageDir('speedscope'), 'dist', 'release');

// Tall enough that the sandwich table of a small profile needs no scrolling.
const VIEWPORT = {width: 1600, height: 2400};

run(async cleanup => {
  if (!fs.existsSync(profile)) {
    return {ok: false, problems: [`no such file: ${profile}`]};
  }
  const profilePath = '/profile/' + path.basename(profile);
  // The exact profile route comes first: '/' would swallow it.
  const base = await serveFiles(cleanup, {[profilePath]: profile, '/': release});
  const context = await launchChromium(cleanup, VIEWPORT);
  const page = context.pages()[0] || await context.newPage();
  const seen = watchPage(page);
  const blocked = await blockOtherRequests(
      page, url => url.startsWith(base + '/'));
  const outcome = importOutcome(page);
  const profileURL = `${base}/profile/${encodeURIComponent(path.basename(profile))}`;
  await page.goto(`${base}/index.html#profileURL=` +
                  `${encodeURIComponent(profileURL)}&view=sandwich`);
  const result = {
    ok: false,
    problems: [],
    imported: false,
    name: null,
    profiles: [],
    ...seen,
    blocked_requests: blocked,
  };
  const failure = await outcome;
  if (failure) {
    result.problems.push(failure);
  } else {
    result.imported = true;
    result.name = (await page.title()).replace(/ - speedscope$/, '');
    result.profiles = await readProfiles(page);
  }
  result.problems.push(...pageProblems(seen));
  result.ok = result.problems.length === 0;
  return result;
}, options.timeout);

// Resolves to null once speedscope says it imported the profile, or to
// the reason it gives for not importing it.
function importOutcome(page) {
  return new Promise(resolve => {
    page.on('console', async message => {
      const text = message.text();
      if (message.type() === 'timeEnd' && text.startsWith('import:')) {
        resolve(null);
      } else if (text.startsWith('Failed to load format')) {
        // The second argument is the exception the importer threw.
        const args = message.args();
        const reason = args.length > 1 ?
            await args[1].evaluate(e => String(e)).catch(() => text) : text;
        resolve(`speedscope could not import the file: ${reason}`);
      }
    });
    page.on('dialog', dialog => {
      resolve(`speedscope: ${dialog.message()}`);
    });
    // Past its importer speedscope catches nothing: a failure there only
    // shows as an uncaught error.
    page.on('pageerror', () => {
      resolve('speedscope failed while importing the file (see page_errors)');
    });
  });
}

async function readProfiles(page) {
  const profiles = [];
  let position = await waitForProfile(page, 1);
  for (;;) {
    profiles.push({
      name: position.name,
      frames: await readSandwichTable(page),
    });
    if (position.index >= position.count) {
      return profiles;
    }
    await page.keyboard.press('n');
    position = await waitForProfile(page, position.index + 1);
  }
}

// The toolbar, between the view tabs and the buttons, names the profile on
// view: as bare text when there is one, else as "NAME (i/N)". Wait until
// it shows profile number index.
async function waitForProfile(page, index) {
  const handle = await page.waitForFunction(wanted => {
    const tab = [...document.querySelectorAll('div')].find(
        div => div.children.length === 1 &&
               div.lastChild.textContent === 'Sandwich');
    const toolbar = tab?.parentElement.parentElement;
    const header = [...document.querySelectorAll('th')]
        .find(th => th.textContent.trim() === 'Symbol Name');
    if (!toolbar || !header) {
      return null;
    }
    for (const span of toolbar.querySelectorAll('span > span')) {
      const match = /^\((\d+)\/(\d+)\)$/.exec(span.textContent.trim());
      if (match) {
        const position = {
          index: Number(match[1]),
          count: Number(match[2]),
          name: span.parentElement.firstChild.textContent.trim(),
        };
        return position.index === wanted ? position : null;
      }
    }
    const name = [...toolbar.childNodes]
        .filter(node => node.nodeType === Node.TEXT_NODE)
        .map(node => node.textContent).join('').trim();
    return wanted === 1 ? {index: 1, count: 1, name} : null;
  }, index, {polling: 50});
  return handle.jsonValue();
}

// The sandwich view's table lists every frame of the profile on view, one
// row each: total, self, then the name (the row's title is the file). The
// table is virtual, so scroll it through to see every row.
async function readSandwichTable(page) {
  return page.evaluate(async () => {
    const nextFrame = () => new Promise(r => requestAnimationFrame(() => r()));
    const header = [...document.querySelectorAll('th')]
        .find(th => th.textContent.trim() === 'Symbol Name');
    const area = header.closest('table').parentElement;
    const scroller = [...area.querySelectorAll('div')]
        .find(div => ['auto', 'scroll'].includes(getComputedStyle(div).overflowY));
    const rows = new Map();
    const collect = () => {
      const top = scroller.getBoundingClientRect().top - scroller.scrollTop;
      for (const row of scroller.querySelectorAll('tr')) {
        const cells = row.querySelectorAll('td');
        if (cells.length !== 3) {
          continue;
        }
        const y = Math.round(row.getBoundingClientRect().top - top);
        rows.set(y, {
          name: cells[2].textContent,
          file: cells[2].title || null,
          total: cells[0].textContent,
          self: cells[1].textContent,
        });
      }
    };
    await nextFrame();
    for (let y = 0; ; y += scroller.clientHeight) {
      scroller.scrollTop = y;
      await nextFrame();
      await nextFrame();
      collect();
      if (y + scroller.clientHeight >= scroller.scrollHeight) {
        break;
      }
    }
    scroller.scrollTop = 0;
    return [...rows.entries()].sort((a, b) => a[0] - b[0]).map(e => e[1]);
  });
}
