// wasmbox prelude: evaluated once as an ES module by wb_init().
// Gives QuickJS-NG a small Node-like surface: console, timers, process,
// require() with fs/path/util/assert/process shims, TextEncoder/TextDecoder.
// It hands hooks to the C side through globalThis.__wasmbox_hooks, which
// wb_init deletes right after.
import * as std from 'qjs:std';
import * as os from 'qjs:os';
import * as bjson from 'qjs:bjson';

const g = globalThis;
const hidden = (obj, name, value) =>
  Object.defineProperty(obj, name, { value, writable: true, configurable: true, enumerable: false });

hidden(g, 'std', std);
hidden(g, 'os', os);
hidden(g, 'bjson', bjson);
hidden(g, 'global', g);

// ------------------------------------------------------------------ inspect
const IDENT = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
const typedArrayProto = Object.getPrototypeOf(Int8Array.prototype);

function quote(s) {
  const q = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = '';
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (ch === q || ch === '\\') out += '\\' + ch;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\t') out += '\\t';
    else if (ch === '\r') out += '\\r';
    else if (c < 0x20 || c === 0x7f) out += '\\x' + c.toString(16).padStart(2, '0');
    else out += ch;
  }
  return q + out + q;
}

function fmtKey(k) {
  if (typeof k === 'symbol') return '[' + k.toString() + ']';
  return IDENT.test(k) ? k : quote(k);
}

function fmtPrimitive(v, top, quoteStrings) {
  switch (typeof v) {
    case 'string': return top && !quoteStrings ? v : quote(v);
    case 'number': return Object.is(v, -0) ? '-0' : String(v);
    case 'bigint': return String(v) + 'n';
    case 'symbol': return v.toString();
    case 'undefined': return 'undefined';
    case 'boolean': return String(v);
  }
  if (v === null) return 'null';
  return undefined;
}

function ctorName(o) {
  try {
    const p = Object.getPrototypeOf(o);
    if (p === null) return null;
    const c = p.constructor;
    return c && typeof c.name === 'string' ? c.name : '';
  } catch { return ''; }
}

function fmtError(e) {
  let head;
  try { head = String(e); } catch { head = 'Error'; }
  let stack = '';
  try { stack = typeof e.stack === 'string' ? e.stack : ''; } catch {}
  stack = stack.replace(/\n+$/, '');
  if (stack.startsWith(head)) return stack; // V8-style stack already has the header
  return stack ? head + '\n' + stack : head;
}

const WIDTH = 72;

function inspect(value, opts) {
  const o = Object.assign({ depth: 2, quoteStrings: false }, opts || {});
  const seen = [];
  function fmt(v, depth, top) {
    const p = fmtPrimitive(v, top, o.quoteStrings);
    if (p !== undefined) return p;
    if (typeof v === 'function') {
      const src = Function.prototype.toString.call(v);
      const name = v.name;
      let base = /^class\b/.test(src) ? `[class ${name || '(anonymous)'}]`
        : `[Function: ${name || '(anonymous)'}]`;
      if (!name && !/^class\b/.test(src)) base = '[Function (anonymous)]';
      const keys = Object.keys(v);
      if (!keys.length || depth > o.depth) return base;
      return wrap(base + ' {', keys.map(k => fmtKey(k) + ': ' + sub(v[k], depth)), '}', depth);
    }
    if (seen.includes(v)) return '[Circular *1]';
    try {
      seen.push(v);
      return fmtObject(v, depth, top);
    } finally {
      seen.pop();
    }
  }
  function sub(v, depth) { return fmt(v, depth + 1, false); }
  function wrap(open, parts, close, depth) {
    if (parts.length === 0) return open.endsWith('{') || open.endsWith('[') ? open + close : open + ' ' + close;
    const flat = open + ' ' + parts.join(', ') + ' ' + close;
    const indent = '  '.repeat(depth);
    // node's rule (util.inspect, breakLength 80): entries + separators + start <= 80
    const total = parts.reduce((a, p) => a + p.length, 0) + parts.length * 2 + indent.length + open.length + 10;
    if (total <= 80 && !flat.includes('\n')) return flat;
    const pad = '  '.repeat(depth + 1);
    // group many short entries on a line, node-style
    if (parts.length > 6 && parts.every(s => s.length <= 16 && !s.includes('\n'))) {
      const w = Math.max(...parts.map(s => s.length)) + 2;
      const perLine = Math.max(1, Math.min(16, Math.floor((WIDTH + 8 - pad.length) / w)));
      const lines = [];
      const numeric = parts.every(s => /^-?[\d.]/.test(s));
      for (let i = 0; i < parts.length; i += perLine) {
        lines.push(parts.slice(i, i + perLine)
          .map((s, j, a) => {
            const cell = s + (i + j < parts.length - 1 ? ',' : '');
            return j === a.length - 1 ? (numeric ? cell.padStart(w - 1) : cell) :
              (numeric ? cell.padStart(w - 1) : cell.padEnd(w - 1));
          }).join(' '));
      }
      return open + '\n' + lines.map(l => pad + l).join('\n') + '\n' + indent + close;
    }
    return open + '\n' + parts.map(s => pad + s).join(',\n') + '\n' + indent + close;
  }
  function props(v, depth, skipIndex) {
    const out = [];
    for (const k of Reflect.ownKeys(v)) {
      if (skipIndex && typeof k === 'string' && /^(0|[1-9]\d*)$/.test(k)) continue;
      const d = Object.getOwnPropertyDescriptor(v, k);
      if (!d || (!d.enumerable && typeof k !== 'symbol') || (typeof k === 'symbol' && !d.enumerable)) continue;
      if (d.get || d.set) {
        out.push(fmtKey(k) + ': ' + (d.get && d.set ? '[Getter/Setter]' : d.get ? '[Getter]' : '[Setter]'));
      } else {
        out.push(fmtKey(k) + ': ' + sub(d.value, depth));
      }
    }
    return out;
  }
  function fmtObject(v, depth, top) {
    const name = ctorName(v);
    if (v instanceof Error) {
      const s = fmtError(v);
      return depth > 0 ? '[' + s.split('\n')[0] + ']' : s;
    }
    if (v instanceof Date) return isNaN(v) ? 'Invalid Date' : v.toISOString();
    if (v instanceof RegExp) return String(v);
    if (v instanceof Promise) return 'Promise { <unknown> }';
    if (v instanceof WeakMap || v instanceof WeakSet) return `${name} { <items unknown> }`;
    if (typeof v.valueOf === 'function' && (v instanceof Number || v instanceof String || v instanceof Boolean)) {
      return `[${name}: ${fmtPrimitive(v.valueOf(), false)}]`;
    }
    if (Array.isArray(v)) {
      if (depth > o.depth) return '[Array]';
      const parts = [];
      const n = v.length, max = 100;
      let holes = 0;
      const flushHoles = () => { if (holes) { parts.push(`<${holes} empty item${holes > 1 ? 's' : ''}>`); holes = 0; } };
      for (let i = 0; i < Math.min(n, max); i++) {
        if (!(i in v)) { holes++; continue; }
        flushHoles();
        parts.push(sub(v[i], depth));
      }
      flushHoles();
      if (n > max) parts.push(`... ${n - max} more item${n - max > 1 ? 's' : ''}`);
      parts.push(...props(v, depth, true));
      const prefix = name && name !== 'Array' ? `${name}(${n}) ` : '';
      return wrap(prefix + '[', parts, ']', depth);
    }
    if (typedArrayProto.isPrototypeOf(v)) {
      if (depth > o.depth) return `[${name}]`;
      const max = 100, n = v.length;
      const parts = Array.from(v.subarray(0, max), x => fmtPrimitive(x, false));
      if (n > max) parts.push(`... ${n - max} more item${n - max > 1 ? 's' : ''}`);
      return wrap(`${name}(${n}) [`, parts, ']', depth);
    }
    if (v instanceof ArrayBuffer) {
      return `ArrayBuffer { byteLength: ${v.byteLength} }`;
    }
    if (v instanceof Map) {
      if (depth > o.depth) return '[Map]';
      const parts = [];
      for (const [k, x] of v) parts.push(sub(k, depth) + ' => ' + sub(x, depth));
      parts.push(...props(v, depth));
      return wrap(`Map(${v.size}) {`, parts, '}', depth);
    }
    if (v instanceof Set) {
      if (depth > o.depth) return '[Set]';
      const parts = [];
      for (const x of v) parts.push(sub(x, depth));
      parts.push(...props(v, depth));
      return wrap(`Set(${v.size}) {`, parts, '}', depth);
    }
    let prefix = '';
    if (name === null) prefix = '[Object: null prototype] ';
    else if (name && name !== 'Object') prefix = name + ' ';
    const tag = v[Symbol.toStringTag];
    if (typeof tag === 'string' && tag && tag !== name) prefix = prefix ? `${prefix.trim()} [${tag}] ` : `Object [${tag}] `;
    if (depth > o.depth) return `[${prefix.trim() || 'Object'}]`;
    return wrap(prefix + '{', props(v, depth), '}', depth);
  }
  try {
    return fmt(value, 0, true);
  } catch (e) {
    try { return String(value); } catch { return '[object]'; }
  }
}

function format(...args) {
  let first = args[0];
  let out = '';
  let i = 0;
  if (typeof first === 'string' && args.length > 1 && first.includes('%')) {
    i = 1;
    out = first.replace(/%([sdifjoOc%])/g, (m, c) => {
      if (c === '%') return '%';
      if (i >= args.length) return m;
      const a = args[i++];
      switch (c) {
        case 's': return typeof a === 'string' ? a : inspect(a, { depth: 1 });
        case 'd': return typeof a === 'bigint' ? a + 'n' : String(Number(a));
        case 'i': return typeof a === 'bigint' ? a + 'n' : String(parseInt(a));
        case 'f': return String(parseFloat(a));
        case 'j': try { return JSON.stringify(a); } catch { return '[Circular]'; }
        case 'o': case 'O': return inspect(a, { depth: 4 });
        case 'c': return '';
      }
    });
    if (i < args.length) out += ' ';
  }
  return out + args.slice(i).map(a => inspect(a)).join(' ');
}

// ------------------------------------------------------------------ console
function writeOut(f, s) {
  f.puts(s);
  f.flush();
}
let groupIndent = '';
function emit(f, args) {
  let s = format(...args);
  if (groupIndent) s = s.split('\n').map(l => groupIndent + l).join('\n');
  writeOut(f, s + '\n');
}
const counts = new Map(), timers = new Map();
const consoleObj = {
  log: (...a) => emit(std.out, a),
  info: (...a) => emit(std.out, a),
  debug: (...a) => emit(std.out, a),
  warn: (...a) => emit(std.err, a),
  error: (...a) => emit(std.err, a),
  trace: (...a) => {
    const st = (new Error().stack || '').split('\n').slice(1).join('\n');
    emit(std.err, ['Trace' + (a.length ? ': ' + format(...a) : '') + '\n' + st]);
  },
  dir: (v, opts) => emit(std.out, [inspect(v, opts)]),
  assert: (cond, ...a) => { if (!cond) emit(std.err, ['Assertion failed' + (a.length ? ': ' + format(...a) : '')]); },
  count: (label = 'default') => { const n = (counts.get(label) || 0) + 1; counts.set(label, n); emit(std.out, [`${label}: ${n}`]); },
  countReset: (label = 'default') => counts.delete(label),
  time: (label = 'default') => timers.set(label, performance.now()),
  timeLog: (label = 'default', ...a) => emit(std.out, [`${label}: ${(performance.now() - timers.get(label)).toFixed(3)}ms`, ...a]),
  timeEnd: (label = 'default') => { emit(std.out, [`${label}: ${(performance.now() - timers.get(label)).toFixed(3)}ms`]); timers.delete(label); },
  group: (...a) => { if (a.length) emit(std.out, a); groupIndent += '  '; },
  groupEnd: () => { groupIndent = groupIndent.slice(2); },
  table: (data) => emit(std.out, [data]),
};
consoleObj.groupCollapsed = consoleObj.group;
hidden(g, 'console', consoleObj);

// ------------------------------------------------------------------ timers
function wrapCb(fn, args) {
  if (typeof fn !== 'function') throw new TypeError('The "callback" argument must be of type function');
  return args.length ? () => fn(...args) : () => fn();
}
hidden(g, 'setTimeout', (fn, ms, ...args) => os.setTimeout(wrapCb(fn, args), Number(ms) || 0));
hidden(g, 'setInterval', (fn, ms, ...args) => os.setInterval(wrapCb(fn, args), Number(ms) || 0));
hidden(g, 'setImmediate', (fn, ...args) => os.setTimeout(wrapCb(fn, args), 0));
const clear = (id) => { if (typeof id === 'number') os.clearTimeout(id); };
hidden(g, 'clearTimeout', clear);
hidden(g, 'clearInterval', clear);
hidden(g, 'clearImmediate', clear);

// ------------------------------------------------------------------ text
class TextEncoder {
  get encoding() { return 'utf-8'; }
  encode(s = '') {
    s = String(s);
    const out = [];
    for (const ch of s) {
      let c = ch.codePointAt(0);
      if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
      if (c < 0x80) out.push(c);
      else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
      else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
      else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    }
    return new Uint8Array(out);
  }
}
class TextDecoder {
  constructor(label = 'utf-8') {
    label = String(label).toLowerCase();
    if (label !== 'utf-8' && label !== 'utf8') throw new RangeError(`TextDecoder: only utf-8 is supported, not '${label}'`);
  }
  get encoding() { return 'utf-8'; }
  decode(buf) {
    if (buf === undefined) return '';
    const b = buf instanceof ArrayBuffer ? new Uint8Array(buf)
      : new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    let s = '';
    let chunk = [];
    for (let i = 0; i < b.length;) {
      const c = b[i];
      let cp = 0xfffd, n = 1;
      if (c < 0x80) { cp = c; }
      else if (c >= 0xc2 && c < 0xe0 && i + 1 < b.length && (b[i + 1] & 0xc0) === 0x80) { cp = ((c & 31) << 6) | (b[i + 1] & 63); n = 2; }
      else if (c >= 0xe0 && c < 0xf0 && i + 2 < b.length && (b[i + 1] & 0xc0) === 0x80 && (b[i + 2] & 0xc0) === 0x80) {
        cp = ((c & 15) << 12) | ((b[i + 1] & 63) << 6) | (b[i + 2] & 63); n = 3;
        if (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)) cp = 0xfffd;
      } else if (c >= 0xf0 && c < 0xf5 && i + 3 < b.length && (b[i + 1] & 0xc0) === 0x80 && (b[i + 2] & 0xc0) === 0x80 && (b[i + 3] & 0xc0) === 0x80) {
        cp = ((c & 7) << 18) | ((b[i + 1] & 63) << 12) | ((b[i + 2] & 63) << 6) | (b[i + 3] & 63); n = 4;
        if (cp < 0x10000 || cp > 0x10ffff) cp = 0xfffd;
      }
      chunk.push(cp);
      i += n;
      if (chunk.length >= 8192) { s += String.fromCodePoint(...chunk); chunk = []; }
    }
    return s + String.fromCodePoint(...chunk);
  }
}
hidden(g, 'TextEncoder', TextEncoder);
hidden(g, 'TextDecoder', TextDecoder);
if (typeof g.structuredClone !== 'function') {
  hidden(g, 'structuredClone', (v) => {
    if (typeof v === 'function' || typeof v === 'symbol') throw new TypeError('structuredClone: value could not be cloned');
    const ab = bjson.write(v, bjson.WRITE_OBJ_REFERENCE);
    return bjson.read(ab, 0, ab.byteLength, bjson.READ_OBJ_REFERENCE);
  });}

// ------------------------------------------------------------------ process
const env = std.getenviron();
const argv = Array.isArray(g.scriptArgs) ? g.scriptArgs.slice() : [];
const processObj = {
  argv,
  argv0: argv[0] || '',
  execArgv: [],
  env,
  platform: 'wasi',
  arch: 'wasm32',
  pid: 1,
  ppid: 0,
  title: 'wasmbox-js',
  version: 'v0.16.2-quickjs-ng',
  versions: { quickjs: '0.16.2', wasmbox: '1' },
  release: { name: 'quickjs-ng' },
  exitCode: undefined,
  exit(code) {
    if (code === undefined) code = processObj.exitCode ?? 0;
    std.out.flush(); std.err.flush();
    std.exit(Number(code) | 0);
  },
  cwd() { const [d, err] = os.getcwd(); if (err) throw fsError(err, 'cwd', '.'); return d; },
  chdir(d) { const err = os.chdir(String(d)); if (err) throw fsError(-err < 0 ? err : -err, 'chdir', d); },
  nextTick(fn, ...args) { queueMicrotask(wrapCb(fn, args)); },
  hrtime: Object.assign((prev) => {
    const ns = BigInt(Math.round(performance.now() * 1e6));
    let s = Number(ns / 1000000000n), n = Number(ns % 1000000000n);
    if (prev) { s -= prev[0]; n -= prev[1]; if (n < 0) { s--; n += 1e9; } }
    return [s, n];
  }, { bigint: () => BigInt(Math.round(performance.now() * 1e6)) }),
  uptime: () => performance.now() / 1000,
  memoryUsage: () => ({ rss: 0, heapTotal: 0, heapUsed: 0, external: 0, arrayBuffers: 0 }),
  stdout: { write(s) { writeOut(std.out, typeof s === 'string' ? s : new TextDecoder().decode(s)); return true; }, isTTY: false },
  stderr: { write(s) { writeOut(std.err, typeof s === 'string' ? s : new TextDecoder().decode(s)); return true; }, isTTY: false },
  on() { return processObj; },
  once() { return processObj; },
  off() { return processObj; },
  emitWarning(w) { emit(std.err, ['Warning: ' + (w && w.message || w)]); },
};
hidden(g, 'process', processObj);

// ------------------------------------------------------------------ fs
// errno numbers of wasi-libc (not Linux), plus whatever std.Error knows
const ERRNO = { EACCES: 2, EBADF: 8, EEXIST: 20, EINVAL: 28, EIO: 29, EISDIR: 31, ELOOP: 32,
  ENAMETOOLONG: 37, ENOENT: 44, ENOSPC: 51, ENOTDIR: 54, ENOTEMPTY: 55, EPERM: 63, EXDEV: 75, ENOTCAPABLE: 76 };
for (const k of Object.getOwnPropertyNames(std.Error || {})) ERRNO[k] = std.Error[k];
const ERRNO_NAMES = {};
for (const [k, v] of Object.entries(ERRNO)) ERRNO_NAMES[v] = k;
function fsError(errno, syscall, path) {
  if (errno < 0) errno = -errno;
  const code = ERRNO_NAMES[errno] || 'EIO';
  const msg = std.strerror(errno).toLowerCase();
  const e = new Error(`${code}: ${msg}, ${syscall} '${path}'`);
  e.errno = -errno; e.code = code; e.syscall = syscall; e.path = String(path);
  return e;
}
const encOf = (o) => typeof o === 'string' ? o : (o && o.encoding) || null;
function toBytes(data) {
  if (typeof data === 'string') return new TextEncoder().encode(data);
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return new TextEncoder().encode(String(data));
}
function openOrThrow(path, mode, syscall) {
  const err = {};
  const f = std.open(String(path), mode, err);
  if (!f) throw fsError(err.errno, syscall || 'open', path);
  return f;
}
function statOrThrow(path, syscall, lstat) {
  const [st, err] = (lstat && os.lstat ? os.lstat : os.stat)(String(path));
  if (err) throw fsError(err, syscall || 'stat', path);
  return st;
}
function makeStats(st) {
  const type = st.mode & os.S_IFMT;
  return {
    dev: st.dev, ino: st.ino, mode: st.mode, nlink: st.nlink, uid: st.uid, gid: st.gid,
    size: st.size, blocks: st.blocks, atimeMs: st.atime, mtimeMs: st.mtime, ctimeMs: st.ctime,
    atime: new Date(st.atime), mtime: new Date(st.mtime), ctime: new Date(st.ctime),
    isFile: () => type === os.S_IFREG,
    isDirectory: () => type === os.S_IFDIR,
    isSymbolicLink: () => type === os.S_IFLNK,
  };
}
function writeBytes(path, data, mode, syscall) {
  const f = openOrThrow(path, mode, syscall);
  try {
    const b = toBytes(data);
    if (b.length) f.write(b.buffer, b.byteOffset, b.length);
    if (f.error()) throw fsError(ERRNO.EIO, 'write', path);
  } finally { f.close(); }
}
function readFileSync(path, opts) {
  if (typeof path === 'number') throw new Error('fs shim: file descriptors are not supported');
  const enc = encOf(opts);
  const st = statOrThrow(path, 'open');
  if ((st.mode & os.S_IFMT) === os.S_IFDIR) throw fsError(ERRNO.EISDIR, 'read', path);
  const r = std.loadFile(String(path), { binary: true });
  if (r === null) throw fsError(ERRNO.EIO, 'read', path);
  if (!enc) return r;
  const e = String(enc).toLowerCase();
  if (e === 'utf8' || e === 'utf-8') return new TextDecoder().decode(r);
  if (e === 'latin1' || e === 'binary') return String.fromCharCode(...r);
  if (e === 'base64') return btoa(Array.from(r, c => String.fromCharCode(c)).join(''));
  if (e === 'hex') return Array.from(r, c => c.toString(16).padStart(2, '0')).join('');
  throw new TypeError(`fs shim: unsupported encoding '${enc}'`);
}
function mkdirSync(path, opts) {
  const recursive = typeof opts === 'object' && opts !== null && !!opts.recursive;
  const mode = typeof opts === 'number' ? opts : (opts && opts.mode) || 0o777;
  path = String(path);
  if (!recursive) {
    const err = os.mkdir(path, mode);
    if (err) throw fsError(err, 'mkdir', path);
    return undefined;
  }
  const parts = path.split('/');
  let cur = path.startsWith('/') ? '' : '.';
  let first;
  for (const p of parts) {
    if (!p) continue;
    cur = cur === '.' ? p : cur + '/' + p;
    const [st, serr] = os.stat(cur);
    if (!serr) {
      if ((st.mode & os.S_IFMT) !== os.S_IFDIR) throw fsError(ERRNO.ENOTDIR, 'mkdir', path);
      continue;
    }
    const err = os.mkdir(cur, mode);
    if (err && Math.abs(err) !== ERRNO.EEXIST) throw fsError(err, 'mkdir', path);
    if (first === undefined) first = cur;
  }
  return first;
}
function readdirSync(path, opts) {
  const [names, err] = os.readdir(String(path));
  if (err) throw fsError(err, 'scandir', path);
  const list = names.filter(n => n !== '.' && n !== '..').sort();
  if (opts && opts.withFileTypes) {
    return list.map(name => {
      const st = makeStats(statOrThrow(String(path) + '/' + name, 'lstat', true));
      return { name, isFile: st.isFile, isDirectory: st.isDirectory, isSymbolicLink: st.isSymbolicLink };
    });
  }
  return list;
}
function rmSync(path, opts) {
  path = String(path);
  const [st, err] = (os.lstat || os.stat)(path);
  if (err) { if (opts && opts.force) return; throw fsError(err, 'rm', path); }
  if ((st.mode & os.S_IFMT) === os.S_IFDIR) {
    if (!(opts && opts.recursive)) throw fsError(ERRNO.EISDIR, 'rm', path);
    for (const n of readdirSync(path)) rmSync(path + '/' + n, opts);
  }
  const e = os.remove(path);
  if (e) throw fsError(e, 'rm', path);
}
const fs = {
  readFileSync,
  writeFileSync: (path, data, opts) => writeBytes(path, data, (opts && opts.flag) === 'a' ? 'ab' : 'wb', 'open'),
  appendFileSync: (path, data) => writeBytes(path, data, 'ab', 'open'),
  existsSync: (path) => { try { return !os.stat(String(path))[1]; } catch { return false; } },
  statSync: (path) => makeStats(statOrThrow(path, 'stat')),
  lstatSync: (path) => makeStats(statOrThrow(path, 'lstat', true)),
  readdirSync,
  mkdirSync,
  rmSync,
  rmdirSync: (path, opts) => rmSync(path, Object.assign({ recursive: false }, opts)),
  unlinkSync: (path) => { const e = os.remove(String(path)); if (e) throw fsError(e, 'unlink', path); },
  renameSync: (a, b) => { const e = os.rename(String(a), String(b)); if (e) throw fsError(e, 'rename', a); },
  copyFileSync: (a, b) => writeBytes(b, readFileSync(a), 'wb', 'copyfile'),
  realpathSync: (p) => { const [r, e] = os.realpath(String(p)); if (e) throw fsError(e, 'realpath', p); return r; },
  constants: { F_OK: 0, R_OK: 4, W_OK: 2, X_OK: 1 },
  accessSync: (path) => { statOrThrow(path, 'access'); },
};
fs.promises = {};
for (const [k, fn] of Object.entries(fs)) {
  if (typeof fn === 'function' && k.endsWith('Sync')) {
    const name = k.slice(0, -4);
    fs.promises[name] = async (...a) => fn(...a);
    fs[name] = (...a) => {
      const cb = typeof a[a.length - 1] === 'function' ? a.pop() : null;
      let r, e = null;
      try { r = fn(...a); } catch (err) { e = err; }
      if (cb) queueMicrotask(() => (name === 'exists' ? cb(r) : cb(e, r)));
    };
  }
}

// ------------------------------------------------------------------ path
function normalizeParts(parts, abs) {
  const out = [];
  for (const p of parts) {
    if (!p || p === '.') continue;
    if (p === '..') { if (out.length && out[out.length - 1] !== '..') out.pop(); else if (!abs) out.push('..'); }
    else out.push(p);
  }
  return out;
}
const path = {
  sep: '/',
  delimiter: ':',
  normalize(p) {
    const abs = p.startsWith('/');
    const trail = p.endsWith('/');
    let r = normalizeParts(p.split('/'), abs).join('/');
    if (!r && !abs) r = '.';
    if (r && trail) r += '/';
    return (abs ? '/' : '') + r;
  },
  join(...a) { const j = a.filter(x => x !== '').join('/'); return j ? path.normalize(j) : '.'; },
  resolve(...a) {
    let r = '';
    for (let i = a.length - 1; i >= 0 && !r.startsWith('/'); i--) r = a[i] + (r ? '/' + r : '');
    if (!r.startsWith('/')) r = processObj.cwd() + '/' + r;
    return '/' + normalizeParts(r.split('/'), true).join('/');
  },
  isAbsolute: (p) => p.startsWith('/'),
  dirname(p) {
    const s = p.replace(/\/+$/, '');
    const i = s.lastIndexOf('/');
    return i < 0 ? '.' : i === 0 ? '/' : s.slice(0, i);
  },
  basename(p, ext) {
    let b = p.replace(/\/+$/, '');
    b = b.slice(b.lastIndexOf('/') + 1);
    if (ext && b.endsWith(ext) && b !== ext) b = b.slice(0, -ext.length);
    return b;
  },
  extname(p) {
    const b = path.basename(p);
    const i = b.lastIndexOf('.');
    return i <= 0 ? '' : b.slice(i);
  },
  relative(from, to) {
    const f = path.resolve(from).split('/').filter(Boolean), t = path.resolve(to).split('/').filter(Boolean);
    let i = 0;
    while (i < f.length && i < t.length && f[i] === t[i]) i++;
    return [...Array(f.length - i).fill('..'), ...t.slice(i)].join('/');
  },
  parse(p) {
    const base = path.basename(p), ext = path.extname(p);
    return { root: p.startsWith('/') ? '/' : '', dir: path.dirname(p), base, ext, name: ext ? base.slice(0, -ext.length) : base };
  },
  format(o) { return (o.dir ? o.dir + '/' : o.root || '') + (o.base || (o.name || '') + (o.ext || '')); },
};
path.posix = path;

// ------------------------------------------------------------------ util, assert
class AssertionError extends Error {
  constructor(msg) { super(msg); this.name = 'AssertionError'; this.code = 'ERR_ASSERTION'; }
}
function deepEqual(a, b, strict) {
  if (strict ? Object.is(a, b) : a == b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (strict && Object.getPrototypeOf(a) !== Object.getPrototypeOf(b)) return false;
  if (a instanceof Date && b instanceof Date) return a.getTime() === b.getTime();
  if (a instanceof Map && b instanceof Map) {
    if (a.size !== b.size) return false;
    for (const [k, v] of a) if (!b.has(k) || !deepEqual(v, b.get(k), strict)) return false;
    return true;
  }
  if (a instanceof Set && b instanceof Set) {
    if (a.size !== b.size) return false;
    for (const v of a) if (!b.has(v)) return false;
    return true;
  }
  const ka = Object.keys(a), kb = Object.keys(b);
  if (ka.length !== kb.length) return false;
  return ka.every(k => Object.prototype.hasOwnProperty.call(b, k) && deepEqual(a[k], b[k], strict));
}
function fail(msg, dflt) {
  if (msg instanceof Error) throw msg;
  throw new AssertionError(msg || dflt);
}
const assert = (v, msg) => { if (!v) fail(msg, `The expression evaluated to a falsy value:\n\n  assert(${inspect(v)})\n`); };
Object.assign(assert, {
  ok: assert,
  AssertionError,
  fail: (msg) => fail(msg, 'Failed'),
  equal: (a, b, m) => { if (a != b) fail(m, `${inspect(a)} == ${inspect(b)}`); },
  notEqual: (a, b, m) => { if (a == b) fail(m, `${inspect(a)} != ${inspect(b)}`); },
  strictEqual: (a, b, m) => { if (!Object.is(a, b)) fail(m, `Expected values to be strictly equal:\n\n${inspect(a)} !== ${inspect(b)}\n`); },
  notStrictEqual: (a, b, m) => { if (Object.is(a, b)) fail(m, `Expected "actual" to be strictly unequal to: ${inspect(b)}`); },
  deepEqual: (a, b, m) => { if (!deepEqual(a, b, false)) fail(m, `Expected values to be loosely deep-equal:\n\n${inspect(a)}\n\nshould loosely deep-equal\n\n${inspect(b)}`); },
  deepStrictEqual: (a, b, m) => { if (!deepEqual(a, b, true)) fail(m, `Expected values to be strictly deep-equal:\n\n${inspect(a)}\n\nshould equal\n\n${inspect(b)}`); },
  notDeepStrictEqual: (a, b, m) => { if (deepEqual(a, b, true)) fail(m, 'Expected "actual" not to be strictly deep-equal to "expected"'); },
  throws: (fn, exp, m) => {
    try { fn(); } catch (e) {
      if (typeof exp === 'function' && exp.prototype !== undefined && !(e instanceof exp)) throw e;
      if (exp instanceof RegExp && !exp.test(String(e && e.message || e))) fail(m, `The error message does not match ${exp}`);
      return;
    }
    fail(typeof exp === 'string' ? exp : m, 'Missing expected exception.');
  },
  rejects: async (p, exp, m) => {
    try { await (typeof p === 'function' ? p() : p); } catch (e) { return; }
    fail(m, 'Missing expected rejection.');
  },
  match: (s, re, m) => { if (!re.test(s)) fail(m, `The input did not match the regular expression ${re}. Input:\n\n${inspect(s)}\n`); },
});
assert.strict = assert;
const util = {
  inspect,
  format,
  isDeepStrictEqual: (a, b) => deepEqual(a, b, true),
  promisify: (fn) => (...a) => new Promise((res, rej) => fn(...a, (e, v) => e ? rej(e) : res(v))),
  types: { isPromise: (v) => v instanceof Promise, isDate: (v) => v instanceof Date, isRegExp: (v) => v instanceof RegExp },
  TextEncoder, TextDecoder,
};

// ------------------------------------------------------------------ require
const builtins = { fs, path, util, assert, process: processObj, 'fs/promises': fs.promises,
  timers: { setTimeout: g.setTimeout, clearTimeout, setInterval: g.setInterval, clearInterval: clear, setImmediate: g.setImmediate },
  'assert/strict': assert };
const BUILTIN_NOTE = 'wasmbox: no npm packages (fetch reaches the hosts the server allows); built-in modules: ' + Object.keys(builtins).join(', ');
const cjsCache = new Map();
function builtinName(name) {
  const n = name.startsWith('node:') ? name.slice(5) : name;
  return Object.prototype.hasOwnProperty.call(builtins, n) ? n : null;
}
function makeRequire(baseDir) {
  function require(name) {
    name = String(name);
    const b = builtinName(name);
    if (b) return builtins[b];
    if (!(name.startsWith('./') || name.startsWith('../') || name.startsWith('/'))) {
      const e = new Error(`Cannot find module '${name}' (${BUILTIN_NOTE})`);
      e.code = 'MODULE_NOT_FOUND';
      throw e;
    }
    let file = path.resolve(baseDir(), name);
    const candidates = [file, file + '.js', file + '.cjs', file + '.json', file + '/index.js'];
    file = candidates.find(f => { const [st, err] = os.stat(f); return !err && (st.mode & os.S_IFMT) === os.S_IFREG; });
    if (!file) {
      const e = new Error(`Cannot find module '${name}'`);
      e.code = 'MODULE_NOT_FOUND';
      throw e;
    }
    if (cjsCache.has(file)) return cjsCache.get(file).exports;
    const src = readFileSync(file, 'utf8');
    const module = { exports: {}, filename: file, id: file, loaded: false };
    cjsCache.set(file, module);
    try {
      if (file.endsWith('.json')) {
        module.exports = JSON.parse(src);
      } else {
        const dir = path.dirname(file);
        const fn = std.evalScript(`(function (exports, require, module, __filename, __dirname) {${src}\n})`,
          { backtrace_barrier: false });
        fn.call(module.exports, module.exports, makeRequire(() => dir), module, file, dir);
      }
    } catch (e) {
      cjsCache.delete(file);
      throw e;
    }
    module.loaded = true;
    return module.exports;
  }
  require.cache = cjsCache;
  require.resolve = (n) => builtinName(n) || path.resolve(baseDir(), n);
  return require;
}
const rootRequire = makeRequire(() => processObj.cwd());
hidden(g, 'require', rootRequire);
hidden(g, 'module', { exports: {}, require: rootRequire });
hidden(g, 'exports', g.module.exports);

// source of an importable ES module for a builtin (used by the C module loader)
function moduleSource(name) {
  const b = builtinName(name);
  if (!b) return '';
  const m = builtins[b];
  const names = Object.keys(m).filter(k => IDENT.test(k) && k !== 'default');
  return `const m = globalThis.require(${JSON.stringify(b)});\nexport default m;\n` +
    (names.length ? `export const { ${names.join(', ')} } = m;\n` : '');
}

// ------------------------------------------------------------------ fetch
// The host makes the request (only to hosts the server allows, WASMBOX_ALLOW_HOSTS) and
// answers through the door; the guest waits for it as in a sleep. The frame is
// `wasmbox:http\n` + JSON head + NUL + body; the answer is JSON head + NUL + body.
const hostCall = g.__wasmbox_host_call;
delete g.__wasmbox_host_call;
class Headers {
  constructor(init) {
    this._h = [];
    if (init == null) return;
    const pairs = init instanceof Headers ? init._h : Array.isArray(init) ? init : Object.entries(init);
    for (const [k, v] of pairs) this.append(k, v);
  }
  append(k, v) { this._h.push([String(k).toLowerCase(), String(v)]); }
  set(k, v) { this.delete(k); this.append(k, v); }
  get(k) {
    k = String(k).toLowerCase();
    const vs = this._h.filter(([n]) => n === k).map(([, v]) => v);
    return vs.length ? vs.join(', ') : null;
  }
  has(k) { return this.get(k) !== null; }
  delete(k) { k = String(k).toLowerCase(); this._h = this._h.filter(([n]) => n !== k); }
  forEach(f, self) { for (const [k, v] of this._h) f.call(self, v, k, this); }
  *entries() { for (const [k, v] of this._h) yield [k, v]; }
  *keys() { for (const [k] of this._h) yield k; }
  *values() { for (const [, v] of this._h) yield v; }
  [Symbol.iterator]() { return this.entries(); }
}
function bodyBytes(body) {
  if (body == null) return new Uint8Array(0);
  if (typeof body === 'string') return new TextEncoder().encode(body);
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  return new TextEncoder().encode(String(body));
}
class Response {
  constructor(body, init = {}) {
    this._body = bodyBytes(body);
    this.status = init.status ?? 200;
    this.statusText = init.statusText ?? '';
    this.headers = new Headers(init.headers);
    this.url = init.url ?? '';
    this.ok = this.status >= 200 && this.status < 300;
    this.redirected = false;
    this.type = 'basic';
    this.bodyUsed = false;
  }
  _take() {
    if (this.bodyUsed) throw new TypeError('Body is unusable: Body has already been read');
    this.bodyUsed = true;
    return this._body;
  }
  async arrayBuffer() { return this._take().slice().buffer; }
  async bytes() { return this._take().slice(); }
  async text() { return new TextDecoder().decode(this._take()); }
  async json() { return JSON.parse(await this.text()); }
  clone() {
    const r = new Response(this._body.slice(), { status: this.status, statusText: this.statusText, headers: this.headers, url: this.url });
    r.redirected = this.redirected;
    return r;
  }
}
async function fetch(input, init = {}) {
  const url = String(typeof input === 'object' && input !== null && 'url' in input ? input.url : input);
  const method = String(init.method || (input && input.method) || 'GET').toUpperCase();
  const headers = new Headers(init.headers || (input && input.headers));
  if (typeof init.body === 'string' && !headers.has('content-type')) headers.set('content-type', 'text/plain;charset=UTF-8');
  const body = bodyBytes(init.body);
  const head = new TextEncoder().encode('wasmbox:http\n' + JSON.stringify({ method, url, headers: headers._h }));
  const frame = new Uint8Array(head.length + 1 + body.length);
  frame.set(head);
  frame.set(body, head.length + 1);
  const answer = new Uint8Array(hostCall(frame.buffer));
  const nul = answer.indexOf(0);
  const a = JSON.parse(new TextDecoder().decode(answer.subarray(0, nul)));
  if (a.error) {
    const cause = new Error(a.error.message);
    cause.code = a.error.kind === 'refused' ? 'ECONNREFUSED' : 'EIO';
    const e = new TypeError('fetch failed: ' + a.error.message);
    e.cause = cause;
    throw e;
  }
  const r = new Response(answer.subarray(nul + 1), { status: a.status, statusText: a.reason, headers: a.headers, url: a.url });
  r.redirected = a.url !== url;
  return r;
}
hidden(g, 'fetch', fetch);
hidden(g, 'Headers', Headers);
hidden(g, 'Response', Response);

// ------------------------------------------------------------------ tools
// Code mode: the tools of the MCP servers the person configured (--mcp-config), as
// `await tools.<server>.<tool>({...})`. The host speaks the tools protocol (version 1, JSON
// frames through the same door); nothing is sent until code first touches `tools`.
class ToolError extends Error {
  constructor(kind, message) { super(message); this.name = 'ToolError'; this.kind = kind; }
}
let toolSeq = 0;
function toolExchange(req) {
  req.v = 1; req.id = ++toolSeq;
  const a = JSON.parse(new TextDecoder().decode(new Uint8Array(hostCall(new TextEncoder().encode(JSON.stringify(req)).buffer))));
  if (a.v !== 1 || a.id !== req.id) throw new ToolError('protocol', 'the host answered out of protocol');
  if (!a.ok) throw new ToolError(a.error.kind, a.error.message);
  return a;
}
function makeTools() {
  const list = toolExchange({ op: 'list' }).tools;
  const servers = {};
  const all = [];
  for (const d of list) {
    const call = async (args = {}) => {
      if (args === null || typeof args !== 'object' || Array.isArray(args)) throw new TypeError(`tools.${d.server}.${d.attr} takes one object of arguments`);
      return toolExchange({ op: 'call', tool: d.name, args }).value;
    };
    Object.defineProperty(call, 'name', { value: d.attr });
    call.description = d.description;
    call.inputSchema = d.inputSchema;
    (servers[d.server] ??= {})[d.attr] = call;
    all.push([d.server + '.' + d.attr, d]);
  }
  const missing = (what) => new Proxy(what, {
    get(t, k) {
      if (typeof k === 'symbol' || k in t) return t[k];
      if (k === 'then' || k === 'toJSON') return undefined;
      throw new TypeError(`${t === out ? 'no MCP server' : 'no tool'} ${String(k)} that code may call; tools.search() lists them`);
    },
  });
  const out = {};
  for (const [name, fns] of Object.entries(servers)) out[name] = missing(fns);
  Object.defineProperties(out, {
    search: { value: (text = '') => all.filter(([n, d]) => (n + ' ' + (d.description || '')).toLowerCase().includes(String(text).toLowerCase())).map(([n]) => n) },
    describe: { value: (name) => {
      const hit = all.find(([n, d]) => n === name || d.name === name);
      if (!hit) throw new TypeError(`no tool ${name}; tools.search() lists them`);
      const [n, d] = hit;
      const props = Object.keys((d.inputSchema && d.inputSchema.properties) || {});
      const req = new Set((d.inputSchema && d.inputSchema.required) || []);
      return `await tools.${n}({${props.map(p => req.has(p) ? p : p + '?').join(', ')}})\n${d.description || ''}` + (d.confirm ? '\n(asks the person for consent before it runs)' : '');
    } },
  });
  return missing(out);
}
let toolsCache;
Object.defineProperty(g, 'tools', {
  get() { return (toolsCache ??= makeTools()); },
  set(v) { toolsCache = v; },
  configurable: true, enumerable: false,
});
hidden(g, 'ToolError', ToolError);

// hooks for the C side
g.__wasmbox_hooks = {
  inspectRepl: (v) => inspect(v, { quoteStrings: true }),
  formatError(e, prefix) {
    let s;
    if (e instanceof Error) {
      s = fmtError(e);
      let c = e.cause, depth = 0;
      while (c !== undefined && depth++ < 10) {
        s += '\nCaused by: ' + (c instanceof Error ? fmtError(c) : inspect(c, { quoteStrings: true }));
        c = c instanceof Error ? c.cause : undefined;
      }
    } else {
      s = inspect(e, { quoteStrings: true });
    }
    return prefix + s + '\n';
  },
  moduleSource,
};
