/*
 * wasmbox_qjs.c - QuickJS-NG WASI reactor entry for wasmbox.
 *
 * Exports (see README.md for the full contract):
 *   memory, _initialize                  (reactor; call _initialize first)
 *   wb_alloc(i32 size) -> i32            malloc, 0 on failure
 *   wb_free(i32 ptr)                     free
 *   wb_init() -> i32                     create runtime+context, install prelude
 *   wb_eval(i32 ptr, i32 len, i32 flags) -> i32
 *                                        flags bit0 ECHO, bit1 MODULE
 *                                        0 ok, 1 JS error, 2 not initialised / OOM
 *   wb_destroy()                         free runtime+context (wb_init may follow)
 *
 * The module may be snapshotted after wb_init: Math.random's seed and
 * performance's time origin are taken at each instance's first wb_eval.
 *
 * Build: see build.sh. This file is compiled together with the QuickJS-NG
 * sources (quickjs.c, quickjs-libc.c, libregexp.c, libunicode.c, dtoa.c) and
 * a generated header wasmbox_prelude.h holding prelude.js as a C string.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>
#include <wasi/api.h>

#include "quickjs.h"
#include "quickjs-libc.h"
#include "wasmbox_prelude.h" /* static const char wb_prelude_js[] */

#define WB_EXPORT(name) __attribute__((export_name(name)))

#define WB_FLAG_ECHO   1
#define WB_FLAG_MODULE 2

#define WB_OK      0
#define WB_ERROR   1
#define WB_FAILURE 2

/* Maximum JS stack depth in bytes of shadow stack (the linker's
   -z stack-size must be larger; build.sh passes both). */
#ifndef WB_JS_STACK_SIZE
#define WB_JS_STACK_SIZE (768 * 1024)
#endif

/* Longest single sleep while waiting for a timer, in ms. Waiting is done
   in slices so that the host's epoch deadline (checked only while wasm
   code runs, not inside a blocking poll_oneoff) is noticed promptly. */
#define WB_SLEEP_SLICE_MS 10

static JSRuntime *wb_rt;
static JSContext *wb_ctx;
static JSValue wb_hooks; /* object returned by the prelude */
static int wb_cell;      /* eval counter, used for file names */

/* ---------------------------------------------------------------- */
/* unhandled rejection tracking (replaces js_std_promise_rejection_tracker,
   which calls exit(1)) */

typedef struct {
    JSValue promise;
    JSValue reason;
} WBRejection;

static WBRejection *wb_rejs;
static int wb_nrejs, wb_caprejs;

static void wb_rej_remove(JSRuntime *rt, int i)
{
    JS_FreeValueRT(rt, wb_rejs[i].promise);
    JS_FreeValueRT(rt, wb_rejs[i].reason);
    wb_rejs[i] = wb_rejs[--wb_nrejs];
}

static void wb_rejection_tracker(JSContext *ctx, JSValueConst promise,
                                 JSValueConst reason, bool is_handled,
                                 void *opaque)
{
    JSRuntime *rt = JS_GetRuntime(ctx);
    int i;
    (void)opaque;
    for (i = 0; i < wb_nrejs; i++) {
        if (JS_IsSameValue(ctx, wb_rejs[i].promise, promise))
            break;
    }
    if (is_handled) {
        if (i < wb_nrejs)
            wb_rej_remove(rt, i);
        return;
    }
    if (i < wb_nrejs)
        return;
    if (wb_nrejs == wb_caprejs) {
        int ncap = wb_caprejs ? wb_caprejs * 2 : 8;
        WBRejection *n = realloc(wb_rejs, ncap * sizeof(*n));
        if (!n)
            return;
        wb_rejs = n;
        wb_caprejs = ncap;
    }
    wb_rejs[wb_nrejs].promise = JS_DupValue(ctx, promise);
    wb_rejs[wb_nrejs].reason = JS_DupValue(ctx, reason);
    wb_nrejs++;
}

static void wb_rej_clear(JSRuntime *rt)
{
    while (wb_nrejs > 0)
        wb_rej_remove(rt, wb_nrejs - 1);
}

/* ---------------------------------------------------------------- */
/* output helpers */

static void wb_flush(void)
{
    fflush(stdout);
    fflush(stderr);
}

/* Call hook `name` of the prelude with args; returns a C string to be
   freed with JS_FreeCString, or NULL (exception cleared). */
static const char *wb_hook_str(JSContext *ctx, const char *name,
                               int argc, JSValueConst *argv)
{
    JSValue fn, r;
    const char *s = NULL;
    if (JS_IsUndefined(wb_hooks))
        return NULL;
    fn = JS_GetPropertyStr(ctx, wb_hooks, name);
    if (JS_IsFunction(ctx, fn)) {
        r = JS_Call(ctx, fn, JS_UNDEFINED, argc, argv);
        if (JS_IsException(r)) {
            JS_FreeValue(ctx, JS_GetException(ctx));
        } else {
            s = JS_ToCString(ctx, r);
            if (!s)
                JS_FreeValue(ctx, JS_GetException(ctx));
            JS_FreeValue(ctx, r);
        }
    }
    JS_FreeValue(ctx, fn);
    return s;
}

/* Print "Uncaught <error>\n<stack>" (prefix "Uncaught " or
   "Uncaught (in promise) ") to stderr. */
static void wb_report(JSContext *ctx, JSValueConst err, const char *prefix)
{
    JSValue args[2];
    const char *s;
    args[0] = (JSValue)err;
    args[1] = JS_NewString(ctx, prefix);
    s = wb_hook_str(ctx, "formatError", 2, args);
    JS_FreeValue(ctx, args[1]);
    if (s) {
        fputs(s, stderr);
        JS_FreeCString(ctx, s);
    } else {
        /* fallback if the prelude is broken or we are out of memory */
        s = JS_ToCString(ctx, err);
        fprintf(stderr, "%s%s\n", prefix, s ? s : "<exception>");
        if (s)
            JS_FreeCString(ctx, s);
        else
            JS_FreeValue(ctx, JS_GetException(ctx));
        if (JS_IsError(err)) {
            JSValue st = JS_GetPropertyStr(ctx, err, "stack");
            s = JS_IsString(st) ? JS_ToCString(ctx, st) : NULL;
            if (s) {
                fputs(s, stderr);
                JS_FreeCString(ctx, s);
            }
            JS_FreeValue(ctx, st);
        }
    }
    fflush(stderr);
}

static void wb_report_exception(JSContext *ctx, const char *prefix)
{
    JSValue e = JS_GetException(ctx);
    wb_report(ctx, e, prefix);
    JS_FreeValue(ctx, e);
}

static void wb_echo(JSContext *ctx, JSValueConst v)
{
    const char *s;
    JSValue arg = (JSValue)v;
    if (JS_IsUndefined(v))
        return;
    s = wb_hook_str(ctx, "inspectRepl", 1, &arg);
    if (!s) {
        s = JS_ToCString(ctx, v);
        if (!s) {
            JS_FreeValue(ctx, JS_GetException(ctx));
            return;
        }
    }
    fputs(s, stdout);
    fputc('\n', stdout);
    JS_FreeCString(ctx, s);
    fflush(stdout);
}

/* ---------------------------------------------------------------- */
/* event loop */

static void wb_sleep_ms(int ms)
{
    struct timespec ts;
    if (ms > WB_SLEEP_SLICE_MS)
        ms = WB_SLEEP_SLICE_MS;
    ts.tv_sec = 0;
    ts.tv_nsec = (long)ms * 1000000L;
    nanosleep(&ts, NULL);
}

/* Run microtasks and timers until nothing is pending. If `result` is a
   promise, it is settled-checked after every microtask drain; on
   fulfilment its value (or, with `async_wrapped`, its .value) is echoed if
   `echo`, on rejection the reason is reported. Returns WB_OK or WB_ERROR. */
static int wb_run_loop(JSContext *ctx, JSValueConst result, int echo,
                       int async_wrapped, int *settled_out)
{
    JSRuntime *rt = JS_GetRuntime(ctx);
    JSContext *ctx1;
    int rc = WB_OK, settled = !JS_IsObject(result), r;

    for (;;) {
        /* drain microtasks */
        for (;;) {
            r = JS_ExecutePendingJob(rt, &ctx1);
            if (r == 0)
                break;
            if (r < 0) {
                wb_report_exception(ctx1, "Uncaught ");
                rc = WB_ERROR;
            }
        }
        if (!settled) {
            int st = JS_PromiseState(ctx, result);
            if (st == JS_PROMISE_FULFILLED) {
                settled = 1;
                if (echo) {
                    JSValue v = JS_PromiseResult(ctx, result);
                    if (async_wrapped && JS_IsObject(v)) {
                        JSValue inner = JS_GetPropertyStr(ctx, v, "value");
                        JS_FreeValue(ctx, v);
                        v = inner;
                    }
                    wb_echo(ctx, v);
                    JS_FreeValue(ctx, v);
                }
            } else if (st == JS_PROMISE_REJECTED) {
                JSValue v = JS_PromiseResult(ctx, result);
                int i;
                settled = 1;
                wb_report(ctx, v, "Uncaught ");
                JS_FreeValue(ctx, v);
                rc = WB_ERROR;
                /* already reported: not an "unhandled rejection" too */
                for (i = 0; i < wb_nrejs; i++) {
                    if (JS_IsSameValue(ctx, wb_rejs[i].promise, result)) {
                        wb_rej_remove(rt, i);
                        break;
                    }
                }
            } else if (st < 0) {
                settled = 1; /* not a promise */
            }
        }
        /* at most one expired timer (also drains jobs first; none left) */
        r = js_std_loop_once(ctx);
        if (r == -2) {
            if (JS_HasException(ctx))
                wb_report_exception(ctx, "Uncaught ");
            rc = WB_ERROR;
            continue;
        }
        if (r == 0)
            continue;
        if (r > 0) {
            fflush(stdout);
            fflush(stderr);
            wb_sleep_ms(r);
            continue;
        }
        break; /* -1: idle */
    }
    if (settled_out)
        *settled_out = settled;
    return rc;
}

/* report and clear unhandled rejections; returns WB_ERROR if any */
static int wb_check_rejections(JSContext *ctx)
{
    int rc = WB_OK;
    while (wb_nrejs > 0) {
        JSValue reason = JS_DupValue(ctx, wb_rejs[0].reason);
        wb_rej_remove(JS_GetRuntime(ctx), 0);
        wb_report(ctx, reason, "Uncaught (in promise) ");
        JS_FreeValue(ctx, reason);
        rc = WB_ERROR;
    }
    return rc;
}

/* ---------------------------------------------------------------- */
/* module loader: built-in node-ish modules ("fs", "node:fs", ...) come
   from the prelude, everything else from the file system */

static JSModuleDef *wb_module_loader(JSContext *ctx, const char *name,
                                     void *opaque, JSValueConst attributes)
{
    JSValue arg, fn;
    const char *src;
    arg = JS_NewString(ctx, name);
    src = wb_hook_str(ctx, "moduleSource", 1, &arg);
    JS_FreeValue(ctx, arg);
    if (src && *src) {
        fn = JS_Eval(ctx, src, strlen(src), name,
                     JS_EVAL_TYPE_MODULE | JS_EVAL_FLAG_COMPILE_ONLY);
        JS_FreeCString(ctx, src);
        if (JS_IsException(fn))
            return NULL;
        /* the module is referenced by the module list */
        JS_FreeValue(ctx, fn);
        return JS_VALUE_GET_PTR(fn);
    }
    if (src)
        JS_FreeCString(ctx, src);
    return js_module_loader(ctx, name, opaque, attributes);
}

/* ---------------------------------------------------------------- */
/* exports */

WB_EXPORT("wb_alloc")
int32_t wb_alloc(int32_t size)
{
    void *p;
    if (size < 0)
        return 0;
    p = malloc(size ? (size_t)size : 1);
    return (int32_t)(uintptr_t)p;
}

WB_EXPORT("wb_free")
void wb_free(int32_t ptr)
{
    free((void *)(uintptr_t)ptr);
}

/* WASI argv as NUL-terminated strings; reactors do not get main(argc, argv) */
static char **wb_get_args(int *pargc)
{
    __wasi_size_t argc = 0, bufsz = 0;
    char **argv;
    char *buf;
    *pargc = 0;
    if (__wasi_args_sizes_get(&argc, &bufsz) != 0)
        return NULL;
    argv = calloc(argc + 1, sizeof(char *));
    buf = malloc(bufsz ? bufsz : 1);
    if (!argv || !buf) {
        free(argv);
        free(buf);
        return NULL;
    }
    if (__wasi_args_get((uint8_t **)argv, (uint8_t *)buf) != 0) {
        free(argv);
        free(buf);
        return NULL;
    }
    *pargc = (int)argc;
    return argv; /* argv[0] points at buf; kept for the runtime's life */
}

/* JS stack limit: WASMBOX_JS_STACK_SIZE from the environment (bytes),
   else WB_JS_STACK_SIZE; clamped to what the shadow stack can hold. */
static size_t wb_js_stack_size(void)
{
    extern unsigned char __stack_low, __stack_high; /* from wasm-ld */
    size_t max = (size_t)(&__stack_high - &__stack_low);
    size_t n = WB_JS_STACK_SIZE;
    const char *e = getenv("WASMBOX_JS_STACK_SIZE");
    if (e && *e)
        n = (size_t)strtoull(e, NULL, 0);
    if (max > 128 * 1024 && n > max - 64 * 1024)
        n = max - 64 * 1024; /* headroom for C code that does not check */
    if (n < 16 * 1024)
        n = 16 * 1024;
    return n;
}

/* ---------------------------------------------------------------- */
/* per-instance clock origin and random seed

   The host snapshots this module after wb_init (a pre-initialised image) and
   starts every sandbox from that snapshot. QuickJS seeds Math.random and sets
   performance's time origin when the context is created, so every sandbox
   would replay the image's sequence and time origin. Ours are set instead at
   the first wb_eval of each instance (wb_fresh), from WASI random_get and the
   clocks of that moment. */

static uint64_t wb_rand_state; /* xorshift64*, never 0 once seeded */
static double wb_origin_mono;  /* monotonic ms at the instance's first eval */
static double wb_origin_epoch; /* epoch ms at the same moment */
static int wb_fresh_done;

static double wb_clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void wb_fresh(void)
{
    wb_fresh_done = 1;
    if (getentropy(&wb_rand_state, sizeof(wb_rand_state)) != 0)
        wb_rand_state = (uint64_t)(wb_clock_ms(CLOCK_REALTIME) * 1e3);
    if (wb_rand_state == 0)
        wb_rand_state = 0x9E3779B97F4A7C15ull;
    wb_origin_mono = wb_clock_ms(CLOCK_MONOTONIC);
    wb_origin_epoch = wb_clock_ms(CLOCK_REALTIME);
}

/* Draws a new Math.random seed (the host calls it in a copied instance, a
   fork, so that the copy does not replay its source's sequence). The clock
   origins stay: a copy goes on from its source's time. */
WB_EXPORT("wb_reseed")
void wb_reseed(void)
{
    if (!wb_fresh_done) {
        wb_fresh();
        return;
    }
    if (getentropy(&wb_rand_state, sizeof(wb_rand_state)) != 0)
        wb_rand_state ^= (uint64_t)(wb_clock_ms(CLOCK_REALTIME) * 1e3);
    if (wb_rand_state == 0)
        wb_rand_state = 0x9E3779B97F4A7C15ull;
}

/* the same generator and double construction as QuickJS's Math.random */
static JSValue wb_math_random(JSContext *ctx, JSValueConst this_val, int argc,
                              JSValueConst *argv)
{
    uint64_t x = wb_rand_state;
    union { uint64_t u; double d; } u;
    (void)this_val; (void)argc; (void)argv;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    wb_rand_state = x;
    u.u = ((uint64_t)0x3ff << 52) | ((x * 0x2545F4914F6CDD1Dull) >> 12);
    return JS_NewFloat64(ctx, u.d - 1.0);
}

static JSValue wb_perf_now(JSContext *ctx, JSValueConst this_val, int argc,
                           JSValueConst *argv)
{
    (void)this_val; (void)argc; (void)argv;
    return JS_NewFloat64(ctx, wb_clock_ms(CLOCK_MONOTONIC) - wb_origin_mono);
}

static JSValue wb_perf_time_origin(JSContext *ctx, JSValueConst this_val)
{
    (void)this_val;
    return JS_NewFloat64(ctx, wb_origin_epoch);
}

static const JSCFunctionListEntry wb_perf_funcs[] = {
    JS_CFUNC_DEF("now", 0, wb_perf_now),
    JS_CGETSET_DEF("timeOrigin", wb_perf_time_origin, NULL),
};

/* ---------------------------------------------------------------- */
/* the door: host calls (an HTTP request to an allowed host, ...) */

/* host.call(req, req_len, out_ptr_ptr, out_len_ptr): 0 with the answer in
   memory from host_alloc (ours to free), -1 when the host takes no such
   frame, -2 when it or its answer did not fit. */
__attribute__((import_module("host"), import_name("call")))
int32_t wb_door(int32_t req, int32_t len, int32_t out_ptr, int32_t out_len);

WB_EXPORT("host_alloc")
int32_t host_alloc(int32_t size)
{
    return wb_alloc(size);
}

/* __wasmbox_host_call(ArrayBuffer) -> ArrayBuffer: the prelude's fetch
   takes it and deletes the global. */
static JSValue wb_host_call(JSContext *ctx, JSValueConst this_val, int argc,
                            JSValueConst *argv)
{
    size_t len;
    uint8_t *buf;
    int32_t out = 0, out_len = 0, rc;
    JSValue r;

    if (argc < 1)
        return JS_ThrowTypeError(ctx, "a frame is needed");
    buf = JS_GetArrayBuffer(ctx, &len, argv[0]);
    if (!buf)
        return JS_EXCEPTION;
    rc = wb_door((int32_t)(uintptr_t)buf, (int32_t)len,
                 (int32_t)(uintptr_t)&out, (int32_t)(uintptr_t)&out_len);
    if (rc == -1)
        return JS_ThrowTypeError(ctx, "no host is bound to the door");
    if (rc != 0)
        return JS_ThrowInternalError(ctx, "the door failed (the request or its answer did not fit)");
    r = JS_NewArrayBufferCopy(ctx, (const uint8_t *)(uintptr_t)out, (size_t)out_len);
    free((void *)(uintptr_t)out);
    return r;
}

/* Replaces Math.random and the performance object with the per-instance
   versions above. 0 on success. */
static int wb_install_fresh(JSContext *ctx)
{
    JSValue global = JS_GetGlobalObject(ctx);
    JSValue math = JS_GetPropertyStr(ctx, global, "Math");
    JSValue perf = JS_NewObject(ctx);
    int rc = -1;

    if (JS_IsObject(math) && !JS_IsException(perf) &&
        JS_SetPropertyStr(ctx, math, "random",
                          JS_NewCFunction(ctx, wb_math_random, "random", 0)) >= 0 &&
        JS_SetPropertyFunctionList(ctx, perf, wb_perf_funcs,
                                   sizeof(wb_perf_funcs) / sizeof(wb_perf_funcs[0])) >= 0 &&
        JS_DefinePropertyValueStr(ctx, global, "performance", JS_DupValue(ctx, perf),
                                  JS_PROP_WRITABLE | JS_PROP_CONFIGURABLE) >= 0 &&
        JS_SetPropertyStr(ctx, global, "__wasmbox_host_call",
                          JS_NewCFunction(ctx, wb_host_call, "hostCall", 1)) >= 0)
        rc = 0;
    JS_FreeValue(ctx, perf);
    JS_FreeValue(ctx, math);
    JS_FreeValue(ctx, global);
    return rc;
}

WB_EXPORT("wb_destroy")
void wb_destroy(void)
{
    if (wb_ctx) {
        JS_FreeValue(wb_ctx, wb_hooks);
        wb_hooks = JS_UNDEFINED;
        wb_rej_clear(wb_rt);
        js_std_free_handlers(wb_rt);
        JS_FreeContext(wb_ctx);
        wb_ctx = NULL;
    }
    if (wb_rt) {
        JS_FreeRuntime(wb_rt);
        wb_rt = NULL;
    }
    free(wb_rejs);
    wb_rejs = NULL;
    wb_nrejs = wb_caprejs = 0;
    wb_flush();
}

WB_EXPORT("wb_init")
int32_t wb_init(void)
{
    static char **argv;
    static int argc;
    static int have_args;
    JSValue val, hooks;
    JSValue global;
    int settled = 0, rc;
    const char *pwd;

    if (wb_ctx)
        return WB_FAILURE; /* already initialised; call wb_destroy first */
    wb_hooks = JS_UNDEFINED;

    if (!have_args) {
        argv = wb_get_args(&argc);
        have_args = 1;
        /* WASI has no process cwd; wasi-libc emulates one starting at "/".
           Honour PWD (the host should set PWD=/workspace). */
        pwd = getenv("PWD");
        if (pwd && *pwd)
            chdir(pwd);
    }

    wb_rt = JS_NewRuntime();
    if (!wb_rt)
        return WB_FAILURE;
    JS_SetMaxStackSize(wb_rt, wb_js_stack_size());
    js_std_init_handlers(wb_rt);
    wb_ctx = JS_NewContext(wb_rt);
    if (!wb_ctx)
        goto fail;
    if (!js_init_module_std(wb_ctx, "qjs:std") ||
        !js_init_module_os(wb_ctx, "qjs:os") ||
        !js_init_module_bjson(wb_ctx, "qjs:bjson"))
        goto fail;
    JS_SetModuleLoaderFunc2(wb_rt, NULL, wb_module_loader,
                            js_module_check_attributes, NULL);
    JS_SetHostPromiseRejectionTracker(wb_rt, wb_rejection_tracker, NULL);
    js_std_add_helpers(wb_ctx, argv ? argc : 0, argv);
    if (wb_install_fresh(wb_ctx) != 0)
        goto fail;

    /* the prelude is a module; it stores its hooks object on
       globalThis.__wasmbox_hooks, which we take and delete */
    val = JS_Eval(wb_ctx, wb_prelude_js, sizeof(wb_prelude_js) - 1,
                  "<wasmbox-prelude>", JS_EVAL_TYPE_MODULE);
    if (JS_IsException(val)) {
        wb_report_exception(wb_ctx, "wasmbox prelude: ");
        goto fail;
    }
    rc = wb_run_loop(wb_ctx, val, 0, 0, &settled);
    if (rc != WB_OK || !settled ||
        JS_PromiseState(wb_ctx, val) != JS_PROMISE_FULFILLED) {
        JS_FreeValue(wb_ctx, val);
        goto fail;
    }
    JS_FreeValue(wb_ctx, val);
    global = JS_GetGlobalObject(wb_ctx);
    hooks = JS_GetPropertyStr(wb_ctx, global, "__wasmbox_hooks");
    {
        JSAtom a = JS_NewAtom(wb_ctx, "__wasmbox_hooks");
        JS_DeleteProperty(wb_ctx, global, a, 0);
        JS_FreeAtom(wb_ctx, a);
    }
    JS_FreeValue(wb_ctx, global);
    if (!JS_IsObject(hooks)) {
        JS_FreeValue(wb_ctx, hooks);
        fputs("wasmbox prelude: no hooks\n", stderr);
        goto fail;
    }
    wb_hooks = hooks;
    wb_flush();
    return WB_OK;

fail:
    wb_flush();
    wb_destroy();
    return WB_FAILURE;
}

WB_EXPORT("wb_eval")
int32_t wb_eval(int32_t ptr, int32_t len, int32_t flags)
{
    JSContext *ctx = wb_ctx;
    char *code;
    char fname[32];
    JSValue val;
    int rc, settled = 0, is_module = (flags & WB_FLAG_MODULE) != 0;

    if (!ctx || len < 0)
        return WB_FAILURE;
    if (!wb_fresh_done)
        wb_fresh();
    code = malloc((size_t)len + 1);
    if (!code)
        return WB_FAILURE;
    if (len)
        memcpy(code, (const void *)(uintptr_t)ptr, (size_t)len);
    code[len] = '\0';

    JS_UpdateStackTop(wb_rt);
    wb_cell++;
    snprintf(fname, sizeof(fname), "<cell%d>", wb_cell);

    if (is_module) {
        val = JS_Eval(ctx, code, len, fname,
                      JS_EVAL_TYPE_MODULE | JS_EVAL_FLAG_COMPILE_ONLY);
        if (!JS_IsException(val)) {
            if (js_module_set_import_meta(ctx, val, false, true) < 0) {
                JS_FreeValue(ctx, val);
                val = JS_EXCEPTION;
            } else {
                val = JS_EvalFunction(ctx, val);
            }
        }
    } else {
        val = JS_Eval(ctx, code, len, fname,
                      JS_EVAL_TYPE_GLOBAL | JS_EVAL_FLAG_ASYNC);
    }
    free(code);

    if (JS_IsException(val)) {
        wb_report_exception(ctx, "Uncaught ");
        rc = WB_ERROR;
        /* still run what the code scheduled before throwing */
        if (wb_run_loop(ctx, JS_UNDEFINED, 0, 0, NULL) != WB_OK)
            rc = WB_ERROR;
    } else {
        rc = wb_run_loop(ctx, val, (flags & WB_FLAG_ECHO) && !is_module,
                         !is_module, &settled);
        if (!settled) {
            fputs("Uncaught Error: top-level await never settled "
                  "(no pending jobs or timers left)\n", stderr);
            rc = WB_ERROR;
        }
        JS_FreeValue(ctx, val);
    }
    if (wb_check_rejections(ctx) != WB_OK)
        rc = WB_ERROR;
    wb_flush();
    return rc;
}
