
# The guest's HTTP: http.client's connections hand their request to the host through the door
# (`wasmbox:http`), which makes it if the server allows the host, and the response is read
# back by http.client's own parser. urllib.request (and what is built on it, such as
# pandas.read_csv of a URL) gets https too, which a guest without TLS could not have.
import sys as _s, types as _t
_n = _t.ModuleType('_wasmbox_net')
exec('''
import io, json, http.client as hc, urllib.request as ur

def dechunk(body):
    out, rest = bytearray(), body
    while rest:
        line, _, rest = rest.partition(b'\\r\\n')
        size = int(line.split(b';')[0], 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return bytes(out)

def exchange(conn, raw):
    from _host import call
    head, _, body = raw.partition(b'\\r\\n\\r\\n')
    lines = head.decode('latin-1').split('\\r\\n')
    method, target = lines[0].split(' ')[:2]
    headers, chunked = [], False
    for line in lines[1:]:
        k, _, v = line.partition(':')
        k, v = k.strip(), v.strip()
        if k.lower() == 'transfer-encoding' and v.lower() == 'chunked':
            chunked = True
        else:
            headers.append([k, v])
    if chunked:
        body = dechunk(body)
    if target.startswith(('http://', 'https://')):
        url = target
    else:
        host = '[' + conn.host + ']' if ':' in conn.host else conn.host
        port = '' if conn.port == conn.default_port else ':' + str(conn.port)
        url = conn.scheme + '://' + host + port + target
    frame = json.dumps({'method': method, 'url': url, 'headers': headers}).encode()
    answer = call(b'wasmbox:http\\n' + frame + b'\\0' + body)
    head, _, body = answer.partition(b'\\0')
    a = json.loads(head)
    err = a.get('error')
    if err:
        kind, msg = err.get('kind'), err.get('message')
        if kind == 'refused':
            raise ConnectionRefusedError(msg)
        raise OSError(msg)
    out = ['HTTP/1.1 %d %s' % (a['status'], a['reason'])]
    out += ['%s: %s' % (k, v) for k, v in a['headers']]
    out += ['Content-Length: %d' % len(body), 'Connection: close', '', '']
    return '\\r\\n'.join(out).encode('latin-1', 'replace') + body

class Sock:
    # What http.client writes to and reads from: the request collects here, and the first
    # read of the response makes the exchange.
    def __init__(self, conn):
        self.conn, self.out, self.inp = conn, bytearray(), None
    def sendall(self, data):
        self.out += data
    def exchange(self):
        if self.inp is None:
            self.inp = io.BytesIO(exchange(self.conn, bytes(self.out)))
    def makefile(self, *args, **kwargs):
        self.exchange()
        return self.inp
    def settimeout(self, t):
        pass
    def setsockopt(self, *args):
        pass
    def close(self):
        pass

def connect(self):
    self.sock = Sock(self)

getresponse = hc.HTTPConnection.getresponse

def exchanged(self):
    # The exchange's errors come from getresponse itself, before a response object exists.
    if isinstance(self.sock, Sock):
        self.sock.exchange()
    return getresponse(self)

hc.HTTPConnection.getresponse = exchanged

hc.HTTPConnection.connect = connect
hc.HTTPConnection.scheme = 'http'

class HTTPSConnection(hc.HTTPConnection):
    default_port = hc.HTTPS_PORT
    scheme = 'https'
    def __init__(self, host, port=None, *args, context=None, **kwargs):
        super().__init__(host, port, *args, **kwargs)

HTTPSConnection.__module__ = 'http.client'
hc.HTTPSConnection = HTTPSConnection
hc.__all__.append('HTTPSConnection')

class HTTPSHandler(ur.AbstractHTTPHandler):
    def __init__(self, debuglevel=None, context=None, check_hostname=None):
        super().__init__(debuglevel)
    def https_open(self, req):
        return self.do_open(HTTPSConnection, req)
    https_request = ur.AbstractHTTPHandler.do_request_

HTTPSHandler.__module__ = 'urllib.request'
ur.HTTPSHandler = HTTPSHandler
ur.__all__.append('HTTPSHandler')
''', _n.__dict__)
_s.modules['_wasmbox_net'] = _n
del _s, _t, _n
