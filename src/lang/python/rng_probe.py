
import sys
r = sys.modules.get('random')
if r is not None:
    st = r._inst.getstate()
    print('random', id(r._inst), int(st[2] is not None), st[1][624], *st[1][:624])
if 'numpy.random' in sys.modules:
    s = sys.modules['numpy.random'].get_state()
    print('numpy', id(sys.modules['numpy.random'].mtrand._rand._bit_generator), int(s[3] != 0), s[2], *s[1].tolist())
