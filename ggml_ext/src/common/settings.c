// The environment variables (common/settings.h): the only place ggml-ext calls getenv. Compiled into ggml-base,
// which every other library of the build links.
#include "common/settings.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char * const names[GGML_EXT_SETTING_COUNT] = {
    [GGML_EXT_SETTING_APQ_BITS]       = "GGML_EXT_APQ_BITS",
    [GGML_EXT_SETTING_DEC]            = "GGML_EXT_DEC",
    [GGML_EXT_SETTING_DEC_CONFIG]     = "GGML_EXT_DEC_CONFIG",
    [GGML_EXT_SETTING_DEC_K]          = "GGML_EXT_DEC_K",
    [GGML_EXT_SETTING_DEC_NTB]        = "GGML_EXT_DEC_NTB",
    [GGML_EXT_SETTING_KV_CALIB]       = "GGML_EXT_KV_CALIB",
    [GGML_EXT_SETTING_KV_OUTLIERS]    = "GGML_EXT_KV_OUTLIERS",
    [GGML_EXT_SETTING_KV_SINK]        = "GGML_EXT_KV_SINK",
    [GGML_EXT_SETTING_KV_VROT]        = "GGML_EXT_KV_VROT",
    [GGML_EXT_SETTING_KV_KROT]        = "GGML_EXT_KV_KROT",
    [GGML_EXT_SETTING_KV_KBLOCK]      = "GGML_EXT_KV_KBLOCK",
    [GGML_EXT_SETTING_KV_VTABLE]      = "GGML_EXT_KV_VTABLE",
    [GGML_EXT_SETTING_KV_ATTN]        = "GGML_EXT_KV_ATTN",
    [GGML_EXT_SETTING_KV_ATTN_SPLIT]  = "GGML_EXT_KV_ATTN_SPLIT",
    [GGML_EXT_SETTING_KVQ_DECODE]     = "GGML_EXT_KVQ_DECODE",
    [GGML_EXT_SETTING_CB_MMV]         = "GGML_EXT_CB_MMV",
    [GGML_EXT_SETTING_DEC_LAUNCH]     = "GGML_EXT_DEC_LAUNCH",
    [GGML_EXT_SETTING_RUNTIME_REPACK] = "GGML_EXT_RUNTIME_REPACK",
};

const char * ggml_ext_setting_name(enum ggml_ext_setting s) {
    return s >= 0 && s < GGML_EXT_SETTING_COUNT ? names[s] : NULL;
}

const char * ggml_ext_setting_text(enum ggml_ext_setting s) {
    const char * name = ggml_ext_setting_name(s);
    const char * v    = name ? getenv(name) : NULL;
    return v && v[0] ? v : NULL;
}

static bool is(enum ggml_ext_setting s, const char * value) {
    const char * v = ggml_ext_setting_text(s);
    return v && !strcmp(v, value);
}

// The index of the value among `values` (n of them); dflt when unset, -1 for another value.
static int choice(enum ggml_ext_setting s, const char * const * values, int n, int dflt) {
    const char * v = ggml_ext_setting_text(s);
    if (!v) {
        return dflt;
    }
    for (int i = 0; i < n; i++) {
        if (values[i] && !strcmp(v, values[i])) {
            return i;
        }
    }
    return -1;
}

// A whole-string integer in [lo, hi] into *out: 1; 0 unset; -1 otherwise.
static int integer(enum ggml_ext_setting s, long lo, long hi, long * out) {
    const char * v = ggml_ext_setting_text(s);
    if (!v) {
        return 0;
    }
    char *     end = NULL;
    const long x   = strtol(v, &end, 10);
    if (!end || *end || x < lo || x > hi) {
        return -1;
    }
    *out = x;
    return 1;
}

int ggml_ext_settings_apq_bits(void) {
    long bits = 0;
    const int r = integer(GGML_EXT_SETTING_APQ_BITS, 1, 8, &bits);
    return r > 0 ? (int) bits : r;
}

const char * ggml_ext_settings_dec(void) {
    return ggml_ext_setting_text(GGML_EXT_SETTING_DEC);
}

const char * ggml_ext_settings_dec_config(void) {
    return ggml_ext_setting_text(GGML_EXT_SETTING_DEC_CONFIG);
}

const char * ggml_ext_settings_dec_k(void) {
    return ggml_ext_setting_text(GGML_EXT_SETTING_DEC_K);
}

const char * ggml_ext_settings_dec_ntb(void) {
    return ggml_ext_setting_text(GGML_EXT_SETTING_DEC_NTB);
}

const char * ggml_ext_settings_kv_calib(void) {
    return ggml_ext_setting_text(GGML_EXT_SETTING_KV_CALIB);
}

int ggml_ext_settings_kv_outliers(float * fraction) {
    const char * v = ggml_ext_setting_text(GGML_EXT_SETTING_KV_OUTLIERS);
    if (!v) {
        return 0;
    }
    char *      end = NULL;
    const float f   = strtof(v, &end);
    if (*end || !(f >= 0.0f && f < 0.5f)) {
        return -1;
    }
    *fraction = f;
    return 1;
}

int ggml_ext_settings_kv_sink(int max_sink) {
    long n = 0;
    const int r = integer(GGML_EXT_SETTING_KV_SINK, 0, max_sink, &n);
    return r > 0 ? (int) n : r;
}

static const char * const off_on[] = { "0", "1" };

int ggml_ext_settings_kv_vrot(void) {
    return choice(GGML_EXT_SETTING_KV_VROT, off_on, 2, 0);
}

int ggml_ext_settings_kv_krot(void) {
    return choice(GGML_EXT_SETTING_KV_KROT, off_on, 2, 0);
}

int ggml_ext_settings_kv_kblock(void) {
    return choice(GGML_EXT_SETTING_KV_KBLOCK, off_on, 2, 2);
}

int ggml_ext_settings_kv_vtable(void) {
    static const char * const values[] = { NULL, "block", "token" };
    return choice(GGML_EXT_SETTING_KV_VTABLE, values, 3, GGML_EXT_KV_VTABLE_AUTO);
}

int ggml_ext_settings_kv_attn(void) {
    static const char * const values[] = { "auto", "ref", "fused", "check" };
    const int                 c        = choice(GGML_EXT_SETTING_KV_ATTN, values, 4, GGML_EXT_KV_ATTN_AUTO);
    return c < 0 ? GGML_EXT_KV_ATTN_AUTO : c;
}

int ggml_ext_settings_kv_attn_split(void) {
    static const char * const values[] = { "0", "1" };
    return choice(GGML_EXT_SETTING_KV_ATTN_SPLIT, values, 2, -1);
}

bool ggml_ext_settings_kvquant_decode_ref(void) {
    return is(GGML_EXT_SETTING_KVQ_DECODE, "ref");
}

// A setting read once for the whole process: *state is 0 until read, then 1 (false) or 2 (true).
static bool read_once(atomic_int * state, bool (*read)(void)) {
    int s = atomic_load(state);
    if (s == 0) {
        s = read() ? 2 : 1;
        atomic_store(state, s);
    }
    return s == 2;
}

static bool codebooks_mmv_is_f32(void) {
    return is(GGML_EXT_SETTING_CB_MMV, "f32");
}

// Read once: the setting picks a kernel for the whole process (a benchmark compares two processes).
bool ggml_ext_settings_codebooks_f32_mmv(void) {
    static atomic_int state;
    return read_once(&state, codebooks_mmv_is_f32);
}

int ggml_ext_settings_dec_launch(void) {
    static const char * const values[] = { NULL, "coop", "split", "onepass" };
    const int                 c        = choice(GGML_EXT_SETTING_DEC_LAUNCH, values, 4, GGML_EXT_DEC_LAUNCH_AUTO);
    return c < 0 ? GGML_EXT_DEC_LAUNCH_AUTO : c;
}

static bool runtime_repack_is_off(void) {
    static const char * const off[] = { "0", "off", "false", "no" };
    return choice(GGML_EXT_SETTING_RUNTIME_REPACK, off, 4, -1) >= 0;
}

// Read once: ggml-cpu picks a weight's buffer type when the model loads, and every weight must agree.
bool ggml_ext_settings_runtime_repack(void) {
    static atomic_int state;
    return !read_once(&state, runtime_repack_is_off);
}
