
def _wasmbox_reseed():
    import os, sys
    r = sys.modules.get('random')
    if r is not None:
        r.seed()
    n = sys.modules.get('numpy.random')
    if n is not None:
        n.seed(sys.modules['numpy'].frombuffer(os.urandom(2496), dtype='<u4'))
_wasmbox_reseed()
del _wasmbox_reseed
