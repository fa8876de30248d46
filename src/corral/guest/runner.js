// corral's persistent JavaScript interpreter, run inside a sandbox (one per code context).
//
// Node's standard modules only; the host passes this whole file as
// `node -e SOURCE -- MAX_FRAME CWD` (corral.runtime.session). The wire is the python
// runner's (corral/guest/runner.py): 4-byte big-endian length + UTF-8 JSON, the same
// message types, except that "ready" carries {"node": version}.
//
// State persists in one vm context: top-level var, let, const, function and class
// declarations of a cell are there for the next. A cell's value is its completion value
// (as in the REPL); a Promise is awaited. console.* and process.stdout/stderr.write come
// back as the cell's stdout/stderr. Output a child process writes straight to fd 1 is not
// captured and breaks the stream: the host then closes the context.
//
// Timeout: the exec message's "timeout" (ms) is enforced here by vm's timeout (a synchronous
// loop) and by a timer (an awaited Promise); a SIGINT (breakOnSigint) also stops a
// synchronous cell. Both end the cell with a TimeoutError / Interrupted error.
'use strict';
const vm = require('vm');
const fs = require('fs');
const util = require('util');

const MAX_FRAME = parseInt(process.argv[process.argv.length - 2], 10) || (16 << 20);
const CWD = process.argv[process.argv.length - 1];
const OUT = 1;
const sleeper = new Int32Array(new SharedArrayBuffer(4));

function writeAll(buf) {
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(OUT, buf, off, buf.length - off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
      Atomics.wait(sleeper, 0, 0, 1);   // a non-blocking pipe that is full: wait 1 ms
    }
  }
}

function emit(msg) {
  let body = Buffer.from(JSON.stringify(msg), 'utf8');
  if (body.length > MAX_FRAME) {
    body = Buffer.from(JSON.stringify({
      type: 'stderr',
      text: `corral: a ${msg.type} message of ${body.length} bytes is over the ` +
            `${MAX_FRAME} byte frame limit and was dropped\n`}), 'utf8');
  }
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length, 0);
  writeAll(Buffer.concat([head, body]));
}

let cell = 0;            // the id of the running cell, 0 between cells
let count = 0;

function out(stream) {
  return (...args) => {
    if (!cell) return;   // a timer's output after its cell ended: dropped
    const text = util.formatWithOptions({colors: false}, ...args) + '\n';
    emit({type: stream, text});
  };
}

const cons = {
  log: out('stdout'), info: out('stdout'), debug: out('stdout'), dir: out('stdout'),
  error: out('stderr'), warn: out('stderr'), trace: out('stderr'),
  table: out('stdout'),
};
for (const [s, name] of [[process.stdout, 'stdout'], [process.stderr, 'stderr']]) {
  s.write = (chunk, enc, cb) => {
    if (cell) emit({type: name, text: typeof chunk === 'string' ? chunk :
                                     Buffer.from(chunk).toString('utf8')});
    if (typeof enc === 'function') enc(); else if (typeof cb === 'function') cb();
    return true;
  };
}

function display(value) {
  if (!cell) return;
  emit({type: 'display', id: cell, data: bundle(value), main: false});
}

const sandbox = {
  console: cons, require, process, Buffer, display, URL, URLSearchParams,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
  queueMicrotask, TextEncoder, TextDecoder,
};
sandbox.global = sandbox;
sandbox.globalThis = sandbox;
const context = vm.createContext(sandbox);

function bundle(value) {
  const data = {'text/plain': util.inspect(value, {depth: 4})};
  if (value !== null && typeof value === 'object') {
    for (const [mime, m] of [['text/html', '_repr_html_'], ['image/svg+xml', '_repr_svg_'],
                             ['text/markdown', '_repr_markdown_'],
                             ['image/png', '_repr_png_']]) {
      if (typeof value[m] === 'function') {
        try {
          const v = value[m]();
          if (typeof v === 'string') data[mime] = v;
          else if (Buffer.isBuffer(v) && mime === 'image/png') data[mime] = v.toString('base64');
        } catch (e) { /* a failing repr is skipped */ }
      }
    }
  }
  return data;
}

function errorOf(e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    const stack = String(e.stack || `${e.name}: ${e.message}`).split('\n');
    const own = stack.findIndex((l) => /\((node:|\[eval\])|at \[eval\]|sigintHandlersWrap/.test(l));
    return {name: String(e.name || 'Error'), value: String(e.message || ''),
            traceback: (own > 0 ? stack.slice(0, own) : stack).map((l) => l + '\n')};
  }
  return {name: 'Error', value: String(e), traceback: ['Uncaught ' + util.inspect(e) + '\n']};
}

async function run(msg) {
  const id = msg.id;
  const timeout = Math.max(1, Math.floor(msg.timeout || 60000));
  count += 1;
  cell = id;
  let error = null;
  try {
    let value = vm.runInContext(msg.code, context, {
      filename: `<cell-${count}>`, timeout, breakOnSigint: true, displayErrors: false});
    if (value && typeof value.then === 'function') {
      let timer;
      const expired = new Promise((_, reject) => {
        timer = setTimeout(() => reject(Object.assign(
          new Error(`the cell's Promise did not settle within ${timeout} ms`),
          {name: 'TimeoutError', stack: 'TimeoutError: the Promise did not settle'})), timeout);
      });
      try { value = await Promise.race([value, expired]); } finally { clearTimeout(timer); }
    }
    if (value !== undefined) {
      emit({type: 'display', id, data: bundle(value), main: true});
    }
  } catch (e) {
    error = errorOf(e);
    if (e && e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') {
      error.name = 'TimeoutError';
    } else if (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
      error.name = 'KeyboardInterrupt';
    }
  }
  if (error) emit(Object.assign({type: 'error', id}, error));
  cell = 0;
  emit({type: 'end', id, count});
}

// a cell's own environment variables (run_code(envs=)): set for that cell, then put back
async function withEnv(env, fn) {
  const saved = {};
  for (const k of Object.keys(env || {})) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : null;
    process.env[k] = String(env[k]);
  }
  try { return await fn(); } finally {
    for (const k of Object.keys(saved)) {
      if (saved[k] === null) delete process.env[k]; else process.env[k] = saved[k];
    }
  }
}

let buf = Buffer.alloc(0);
let chain = Promise.resolve();
process.stdin.on('data', (chunk) => {
  buf = Buffer.concat([buf, chunk]);
  while (buf.length >= 4) {
    const n = buf.readUInt32BE(0);
    if (buf.length < 4 + n) break;
    const msg = JSON.parse(buf.subarray(4, 4 + n).toString('utf8'));
    buf = buf.subarray(4 + n);
    if (msg.type === 'exec') chain = chain.then(() => withEnv(msg.env, () => run(msg)));
  }
});
process.stdin.on('end', () => process.exit(0));
process.on('SIGINT', () => {});   // between cells: ignored (in a cell: breakOnSigint)
process.on('uncaughtException', (e) => {   // a timer's throw after its cell: kept alive
  if (cell) emit(Object.assign({type: 'stderr'}, {text: String(e && e.stack || e) + '\n'}));
});
process.on('unhandledRejection', () => {});

try {
  if (CWD) process.chdir(CWD);
} catch (e) {
  emit({type: 'fatal', message: String(e.message || e)});
  process.exit(1);
}
emit({type: 'ready', version: 1, node: process.version});
