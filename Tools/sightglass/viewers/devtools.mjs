// Load a file with Chrome DevTools' own loading code, run in Node.
//
//   node devtools.mjs [--timeout SECONDS] heapsnapshot FILE
//   node devtools.mjs [--timeout SECONDS] cpuprofile FILE
//
// The chrome-devtools-frontend package ships DevTools' TypeScript sources;
// esbuild bundles the modules needed here into one file that Node imports.
//
// heapsnapshot: the Memory panel's path. The file is streamed in chunks
// into HeapSnapshotLoader (the heap snapshot worker's parser), then
// buildSnapshot() makes the JSHeapSnapshot, its secondary initialisation
// (retainers, dominators) running behind a MessageChannel as in the second
// worker; the report is what the Summary view lists, from
// aggregatesWithFilter(), plus getStatistics(). DevTools does not check
// that the arrays hold node_count and edge_count entries (it reads past or
// short of them silently), so we also check those counts and references
// ourselves, reported apart as format_errors.
//
// cpuprofile: the Performance panel's path for a .cpuprofile file. It is
// wrapped by SamplesIntegrator.createFakeTraceFromCpuProfile() and parsed by
// the trace engine with all its handlers, as when such a file is loaded;
// the report lists the calls its samples handler builds for the flame
// chart. CPUProfileDataModel, the model under that handler, is also built
// directly, since the trace engine swallows some of its failures; its tree
// gives the function names.
//
// Prints {ok, problems, ...}: ok when DevTools raised nothing, logged no
// warning or error, and our checks passed.

import fs from 'node:fs';
import path from 'node:path';
import {pathToFileURL} from 'node:url';

import {makeTempDir, packageDir, parseArgs, requireViewer, run} from './common.mjs';

const USAGE = 'devtools.mjs [--timeout SECONDS] heapsnapshot|cpuprofile FILE';
const {options, positional} = parseArgs(process.argv.slice(2), USAGE);
const KINDS = {heapsnapshot: heapSnapshot, cpuprofile: cpuProfile};
if (positional.length !== 2 || !(positional[0] in KINDS)) {
  process.stderr.write(`usage: ${USAGE}\n`);
  process.exit(2);
}
const [kind, file] = [positional[0], path.resolve(positional[1])];

// DevTools is written for current Chrome; Node 20 lacks this one.
Promise.withResolvers ??= function () {
  let resolve, reject;
  const promise = new this((yes, no) => {
    resolve = yes;
    reject = no;
  });
  return {promise, resolve, reject};
};

// DevTools reports trouble it survives on the console; keep it.
function captureConsole(logged, cleanup) {
  const saved = {warn: console.warn, error: console.error};
  console.warn = console.error = (...args) => logged.push(args.join(' '));
  cleanup.add(() => Object.assign(console, saved));
}

const MODULES = {
  heapsnapshot: {
    HeapSnapshotLoader: 'entrypoints/heap_snapshot_worker/HeapSnapshotLoader.js',
    HeapSnapshot: 'entrypoints/heap_snapshot_worker/HeapSnapshot.js',
    HeapSnapshotModel: 'models/heap_snapshot/HeapSnapshotModel.js',
  },
  cpuprofile: {
    CPUProfile: 'models/cpu_profile/cpu_profile.js',
    Trace: 'models/trace/trace.js',
  },
};

async function loadDevTools(cleanup) {
  const esbuild = requireViewer('esbuild');
  const entry = Object.entries(MODULES[kind])
      .map(([name, module]) => `export * as ${name} from './${module}';`)
      .join('\n');
  const built = await esbuild.build({
    stdin: {
      contents: entry,
      resolveDir: path.join(packageDir('chrome-devtools-frontend'), 'front_end'),
      loader: 'js',
    },
    bundle: true,
    format: 'esm',
    platform: 'node',
    write: false,
    logLevel: 'silent',
    plugins: [generatedLocales],
  });
  const bundle = path.join(makeTempDir(cleanup), 'devtools.mjs');
  fs.writeFileSync(bundle, built.outputFiles[0].contents);
  return import(pathToFileURL(bundle).href);
}

// core/i18n imports locales.js, which DevTools' build generates. Only
// en-US is needed: nothing here is shown to a user.
const generatedLocales = {
  name: 'generated-locales',
  setup(build) {
    build.onResolve({filter: /^\.\/locales\.js$/}, () => ({
      path: 'locales.js',
      namespace: 'generated',
    }));
    build.onLoad({filter: /.*/, namespace: 'generated'}, () => ({
      contents: [
        `export const LOCALES = ['en-US'];`,
        `export const BUNDLED_LOCALES = ['en-US'];`,
        `export const DEFAULT_LOCALE = 'en-US';`,
        `export const REMOTE_FETCH_PATTERN = '';`,
        `export const LOCAL_FETCH_PATTERN = '';`,
      ].join('\n'),
      loader: 'js',
    }));
  },
};

function errorText(error) {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

async function heapSnapshot(devtools) {
  const result = {
    ok: false,
    problems: [],
    format_errors: checkHeapSnapshot(fs.readFileSync(file, 'utf8')),
    node_count: null,
    edge_count: null,
    classes: [],
    statistics: null,
  };
  result.problems.push(...result.format_errors.map(e => `format: ${e}`));
  // The loader reports progress to the UI through the dispatcher.
  const dispatcher = {sendEvent() {}};
  const loader = new devtools.HeapSnapshotLoader.HeapSnapshotLoader(dispatcher);
  for await (const chunk of fs.createReadStream(
      file, {encoding: 'utf8', highWaterMark: 1 << 20})) {
    loader.write(chunk);
  }
  loader.close();
  const channel = new MessageChannel();
  new devtools.HeapSnapshot.SecondaryInitManager(channel.port2);
  let snapshot;
  try {
    snapshot = await loader.buildSnapshot(channel.port1);
  } catch (e) {
    result.problems.push(`DevTools rejected the snapshot: ${errorText(e)}`);
    return result;
  } finally {
    channel.port1.close();
  }
  result.node_count = snapshot.nodeCount;
  result.edge_count = snapshot.containmentEdges.length / snapshot.edgeFieldsCount;
  const aggregates = snapshot.aggregatesWithFilter(
      new devtools.HeapSnapshotModel.NodeFilter());
  result.classes = Object.values(aggregates)
      .map(a => ({name: a.name, count: a.count, self_size: a.self,
                  max_retained_size: a.maxRet}))
      .sort((a, b) => b.self_size - a.self_size || a.name.localeCompare(b.name));
  result.statistics = snapshot.getStatistics();
  return result;
}

// What DevTools takes on trust: the counts in the header and the
// references between nodes, edges and strings.
function checkHeapSnapshot(text) {
  let data;
  try {
    data = JSON.parse(text);
  } catch (e) {
    return [`not JSON: ${e.message}`];
  }
  const errors = [];
  const meta = data?.snapshot?.meta;
  const nodeFields = meta?.node_fields;
  const edgeFields = meta?.edge_fields;
  if (!Array.isArray(nodeFields) || !Array.isArray(edgeFields) ||
      !Array.isArray(data.nodes) || !Array.isArray(data.edges) ||
      !Array.isArray(data.strings)) {
    return ['missing snapshot.meta node_fields/edge_fields, nodes, edges or strings'];
  }
  const {node_count: nodeCount, edge_count: edgeCount} = data.snapshot;
  if (data.nodes.length !== nodeCount * nodeFields.length) {
    errors.push(`nodes has ${data.nodes.length} numbers, node_count ${nodeCount}` +
                ` x ${nodeFields.length} fields needs ${nodeCount * nodeFields.length}`);
  }
  if (data.edges.length !== edgeCount * edgeFields.length) {
    errors.push(`edges has ${data.edges.length} numbers, edge_count ${edgeCount}` +
                ` x ${edgeFields.length} fields needs ${edgeCount * edgeFields.length}`);
  }
  const edgeCountAt = nodeFields.indexOf('edge_count');
  const nameAt = nodeFields.indexOf('name');
  let edgesClaimed = 0;
  for (let i = 0; i < data.nodes.length; i += nodeFields.length) {
    edgesClaimed += data.nodes[i + edgeCountAt];
    const name = data.nodes[i + nameAt];
    if (!(name < data.strings.length)) {
      errors.push(`node ${i / nodeFields.length}: name ${name} is not a string index`);
    }
  }
  if (edgesClaimed !== edgeCount) {
    errors.push(`the nodes' edge_count add up to ${edgesClaimed},` +
                ` not edge_count ${edgeCount}`);
  }
  const toNodeAt = edgeFields.indexOf('to_node');
  for (let i = 0; i < data.edges.length; i += edgeFields.length) {
    const to = data.edges[i + toNodeAt];
    if (to % nodeFields.length !== 0 || !(to < data.nodes.length)) {
      errors.push(`edge ${i / edgeFields.length}: to_node ${to} is not a node's offset`);
    }
  }
  return errors.slice(0, 20);
}

async function cpuProfile(devtools) {
  const result = {
    ok: false,
    problems: [],
    format_errors: [],
    function_names: [],
    threads: [],
  };
  const text = fs.readFileSync(file, 'utf8');
  let profile;
  try {
    profile = JSON.parse(text);
  } catch (e) {
    result.problems.push(`DevTools cannot read the file: not JSON: ${e.message}`);
    return result;
  }
  // The Performance panel takes an object with nodes for a CPU profile.
  if (!profile?.nodes) {
    result.problems.push(
        'DevTools would not take the file for a CPU profile: no "nodes"');
    return result;
  }
  result.format_errors = checkCpuProfile(profile);
  result.problems.push(...result.format_errors.map(e => `format: ${e}`));

  try {
    // The models change the profile they are given, so each gets a copy.
    const model = new devtools.CPUProfile.CPUProfileDataModel.CPUProfileDataModel(
        JSON.parse(text));
    const names = new Set();
    const visit = node => {
      names.add(node.functionName);
      node.children.forEach(visit);
    };
    visit(model.profileHead);
    result.function_names = [...names];
  } catch (e) {
    result.problems.push(`CPUProfileDataModel rejected the profile: ${errorText(e)}`);
  }

  const {Trace} = devtools;
  try {
    const trace = Trace.Helpers.SamplesIntegrator.SamplesIntegrator
        .createFakeTraceFromCpuProfile(JSON.parse(text), Trace.Types.Events.ThreadID(1));
    const engine = Trace.TraceModel.Model.createWithAllHandlers();
    await engine.parse(trace.traceEvents, {
      metadata: {dataOrigin: Trace.Types.File.DataOrigin.CPU_PROFILE},
      isFreshRecording: false,
      isCPUProfile: true,
    });
    const samples = engine.parsedTrace().data.Samples;
    for (const [pid, threads] of samples.profilesInProcess) {
      for (const [tid, data] of threads) {
        const start = data.parsedProfile.profileStartTime * 1000;
        result.threads.push({
          pid, tid,
          calls: data.profileCalls.map(call => ({
            name: call.callFrame.functionName,
            url: call.callFrame.url,
            start_us: call.ts - start,
            duration_us: call.dur,
          })),
        });
      }
    }
  } catch (e) {
    result.problems.push(`the trace engine rejected the profile: ${errorText(e)}`);
  }
  if (!result.threads.length) {
    result.problems.push('the Performance panel would show no CPU profile');
  }
  return result;
}

// What DevTools takes on trust: that samples and children name nodes, that
// all nodes hang from the root, and that every sample has its time delta.
function checkCpuProfile(profile) {
  const errors = [];
  const {nodes, samples, timeDeltas} = profile;
  if (!Array.isArray(nodes) || !nodes.length) {
    return ['"nodes" is not a non-empty array'];
  }
  const ids = new Set();
  for (const node of nodes) {
    if (ids.has(node?.id)) {
      errors.push(`node id ${node?.id} appears twice`);
    }
    ids.add(node?.id);
  }
  // Chrome writes children; DevTools falls back on parent when the first
  // node has none.
  const children = new Map(nodes.map(node => [node?.id, []]));
  const byChildren = Array.isArray(nodes[0]?.children);
  for (const node of nodes) {
    const [from, to] = byChildren ? [node.id, node.children || []] :
                                    [node.parent, [node.id]];
    for (const child of to) {
      if (!ids.has(child)) {
        errors.push(`node ${node.id} has unknown child ${child}`);
      } else if (children.has(from)) {
        children.get(from).push(child);
      }
    }
  }
  const reached = new Set();
  const stack = [nodes[0].id];
  while (stack.length) {
    const id = stack.pop();
    if (!reached.has(id)) {
      reached.add(id);
      stack.push(...children.get(id));
    }
  }
  if (reached.size !== ids.size) {
    errors.push(`${ids.size - reached.size} nodes are not under the root` +
                ` (the first node)`);
  }
  if (samples !== undefined) {
    if (!Array.isArray(samples) || !Array.isArray(timeDeltas) ||
        samples.length !== timeDeltas.length) {
      errors.push('"samples" and "timeDeltas" are not arrays of one length');
    } else {
      for (const id of new Set(samples)) {
        if (!ids.has(id)) {
          errors.push(`a sample names unknown node ${id}`);
        }
      }
    }
  }
  return errors.slice(0, 20);
}

run(async cleanup => {
  if (!fs.existsSync(file)) {
    return {ok: false, problems: [`no such file: ${file}`]};
  }
  const devtools = await loadDevTools(cleanup);
  const logged = [];
  captureConsole(logged, cleanup);
  const result = await KINDS[kind](devtools);
  result.warnings = logged;
  result.problems.push(...logged.map(line => `DevTools logged: ${line}`));
  result.ok = result.problems.length === 0;
  return result;
}, options.timeout);
