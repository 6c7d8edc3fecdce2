
import os, sys, types
os.chdir('/workspace')
_wb = types.ModuleType('_wasmbox')
exec('''
import os, sys, json, linecache, __main__

last = None
limit = 0
sent = 0
installed = []

def turn(text, name):
    # The reactor's `_run_turn` for every turn after this one, all of them the host's calls of
    # this module's functions, as JSON `[name, *args]`. The reactor's own parses each turn into
    # Python AST objects and compiles them, for its echo of a final expression: with our own
    # compile of the caller's code that was most of a small one-shot's turn.
    call = json.loads(text)
    globals()[call[0]](*call[1:])

def script(src):
    exec(compile(src, '<wasmbox>', 'exec', dont_inherit=True), __main__.__dict__)

def _show(*args, **kwargs):
    # plt.show() on the headless Agg backend: the figures go to the host now and close, as a
    # notebook's inline backend shows them (a loop that shows each gets each); without images
    # asked for, nothing.
    if limit:
        figures()

def figures():
    # Hands the open figures to the host as PNG through the door, never through stdout or
    # stderr, which the caller's code writes too; the host bounds them. Past the run's count a
    # figure is only counted, not rendered. All are closed: the next turn does not send them.
    global sent
    h = sys.modules.get('matplotlib._pylab_helpers')
    if h is None or not h.Gcf.figs:
        return
    import io
    from _host import call
    try:
        for m in h.Gcf.get_all_fig_managers():
            if sent >= limit:
                call(b'wasmbox:skip\\n')
                continue
            buf = io.BytesIO()
            try:
                m.canvas.figure.savefig(buf, format='png', dpi=100)
            except Exception as e:
                call(b'wasmbox:note\\n' + f'figure {m.num} could not be rendered: {e!r}'.encode())
                continue
            call(b'wasmbox:png\\n' + buf.getvalue())
            sent += 1
    finally:
        h.Gcf.destroy_all()

def use(paths):
    # The sandbox's installed packages (trees under /packages), after the bundled ones so that
    # none is ever shadowed; a tree no longer listed leaves sys.path.
    global installed
    if paths == installed:
        return
    sys.path[:] = [p for p in sys.path if p not in installed] + paths
    installed = list(paths)
    # Only these paths' finders: importlib.invalidate_caches() would make the stdlib zip's
    # importer read its 6,000-entry directory again (~15 ms at the next import). A tree never
    # changes under its name, so a finder made for it once stays right.
    for p in paths:
        sys.path_importer_cache.pop(p, None)

def run(src, echo=False, images=0, env=None, cwd=None, packages=None):
    global last, limit, sent
    last = None
    limit, sent = images, 0
    if packages is not None or installed:
        use(packages or [])
    # Each write goes through WASI (a putenv per variable, a stat for chdir): skip them when
    # nothing changes, as in a session's later turns and a ready instance's first.
    if env is not None and env != os.environ:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None and cwd != os.getcwd():
        os.chdir(cwd)
    plt = sys.modules.get('matplotlib.pyplot')
    if plt is not None and plt.show is not _show:
        plt.show = _show
    name = '<code>'
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    g = __main__.__dict__
    try:
        if echo:
            import ast
            tree = ast.parse(src, name)
            tail = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, name, 'exec', dont_inherit=True), g)
            if tail is not None:
                value = eval(compile(ast.Expression(tail.value), name, 'eval', dont_inherit=True), g)
                if value is not None:
                    last = value
                    sys.displayhook(value)
        else:
            exec(compile(src, name, 'exec', dont_inherit=True), g)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__
        e.__traceback__ = tb.tb_next if tb is not None else None
        sys.excepthook(type(e), e, e.__traceback__)
        raise SystemExit(1) from None
    finally:
        # In the same turn, and almost free when nothing was plotted: a dict's emptiness.
        if limit:
            h = sys.modules.get('matplotlib._pylab_helpers')
            if h is not None and h.Gcf.figs:
                try:
                    figures()
                except Exception as e:
                    sys.stderr.write(f'wasmbox: the figures could not be returned: {e!r}\\n')

def warm(env):
    # Readies a fresh instance: its own random sequences (a snapshot would share the image's),
    # and one pass through run() so the caller's turn finds those pages already copied.
    import random
    random.seed()
    np = sys.modules.get('numpy')
    if np is not None:
        np.random.seed()
    run("print('', end='')", False, 1, env, '/workspace')

def polish(modules):
    # Readies a pooled instance while the pool is idle: maps what a first turn would fault in
    # (run, print, numpy's common paths, and the imports of the image's modules that most
    # turns start with, in a namespace of their own). Leaves nothing behind in __main__.
    # Images asked for, as calls ask: the end-of-turn look for figures maps its pages too.
    run("print('', end='')", False, 1)
    for m in modules:
        exec(compile('import ' + m, '<polish>', 'exec', dont_inherit=True), {})
    np = sys.modules.get('numpy')
    if np is not None:
        str(np.arange(8).sum())

def rich(max_html):
    # Figures came back in the turn itself (see figures()): only a final DataFrame is left.
    import json
    out, notes = [], []
    pd = sys.modules.get('pandas')
    if pd is not None and isinstance(last, (pd.DataFrame, pd.Series)):
        frame = last.to_frame() if isinstance(last, pd.Series) else last
        html = frame.to_html(max_rows=60, max_cols=30)
        if len(html) > max_html:
            notes.append(f'the DataFrame HTML ({len(html)} bytes) was dropped: the limit is {max_html}')
        else:
            out.append({'type': 'text/html', 'data': html})
    sys.stdout.write(json.dumps({'outputs': out, 'notes': notes}))
''', _wb.__dict__)
sys.modules['_wasmbox'] = _wb
import _reactor
_reactor._run_turn = _wb.turn
del os, sys, types, _reactor, _wb
