// Every environment variable ggml-ext reads, read here only (common/settings.c), each through an accessor that
// parses it and states its default. docs/DEVELOPING.md "Settings" lists them: what users set also has a flag of
// our tools and of llama.cpp's (the patched common arguments) and a Llama(...) keyword, and its variable stays
// for the programs that cannot take a flag; the debug variables select a fallback path or a variant that a test
// or a RESULTS comparison runs.
//
// A variable is read when its accessor is called, not cached at start-up, unless said otherwise: tests and
// llama-cpp-python users set a variable in the process between two contexts (os.environ before Llama(...)),
// and a setting read once would silently ignore the second value.
#pragma once

#include "ggml-ext.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

// The variables, for messages that quote a bad value.
enum ggml_ext_setting {
    GGML_EXT_SETTING_APQ_BITS,
    GGML_EXT_SETTING_DEC,
    GGML_EXT_SETTING_DEC_CONFIG,
    GGML_EXT_SETTING_DEC_K,
    GGML_EXT_SETTING_DEC_NTB,
    GGML_EXT_SETTING_KV_CALIB,
    GGML_EXT_SETTING_KV_OUTLIERS,
    GGML_EXT_SETTING_KV_SINK,
    GGML_EXT_SETTING_KV_VROT,
    GGML_EXT_SETTING_KV_KROT,
    GGML_EXT_SETTING_KV_KBLOCK,
    GGML_EXT_SETTING_KV_VTABLE,
    GGML_EXT_SETTING_KV_ATTN,
    GGML_EXT_SETTING_KV_ATTN_SPLIT,
    GGML_EXT_SETTING_KVQ_DECODE,
    GGML_EXT_SETTING_CB_MMV,
    GGML_EXT_SETTING_DEC_LAUNCH,
    GGML_EXT_SETTING_RUNTIME_REPACK,
    GGML_EXT_SETTING_COUNT
};

// The variable's name ("GGML_EXT_APQ_BITS") and its value as set (NULL when unset or empty).
GGML_EXT_API const char * ggml_ext_setting_name(enum ggml_ext_setting s);
GGML_EXT_API const char * ggml_ext_setting_text(enum ggml_ext_setting s);

// ---- user settings (flags: --apq-bits, --dec*, --kv-calib, --kv-outliers, --kv-sink) ----

// GGML_EXT_APQ_BITS: the any-precision weights' precision, 1..8; 0 unset (the file's highest), -1 not a precision.
GGML_EXT_API int          ggml_ext_settings_apq_bits(void);
// GGML_EXT_DEC: a QDEC side file; GGML_EXT_DEC_CONFIG: a tuned QDEC configuration file; GGML_EXT_DEC_K /
// GGML_EXT_DEC_NTB: QDEC's k_chunk / thread blocks, "N" or "qkv=N,o=N,gateup=N,down=N" (llama/qdec.c parses
// them as it parses --dec-k / --dec-ntb). NULL when unset.
GGML_EXT_API const char * ggml_ext_settings_dec(void);
GGML_EXT_API const char * ggml_ext_settings_dec_config(void);
GGML_EXT_API const char * ggml_ext_settings_dec_k(void);
GGML_EXT_API const char * ggml_ext_settings_dec_ntb(void);
// GGML_EXT_KV_CALIB: the KV calibration of the KVQuant cache types; NULL when unset.
GGML_EXT_API const char * ggml_ext_settings_kv_calib(void);
// GGML_EXT_KV_OUTLIERS: the outlier fraction in [0, 0.5) into *fraction: 1; 0 unset; -1 not such a fraction.
GGML_EXT_API int          ggml_ext_settings_kv_outliers(float * fraction);
// GGML_EXT_KV_SINK: the first positions kept in float, 0..max_sink; 0 unset; -1 out of range.
GGML_EXT_API int          ggml_ext_settings_kv_sink(int max_sink);

// ---- debug: variants and fallbacks that tests and comparisons select ----

// GGML_EXT_KV_VROT / GGML_EXT_KV_KROT: a NUQ value / key cache takes upstream's Hadamard rotation. 1 on,
// 0 unset or "0", -1 another value.
GGML_EXT_API int ggml_ext_settings_kv_vrot(void);
GGML_EXT_API int ggml_ext_settings_kv_krot(void);
// GGML_EXT_KV_KBLOCK: block-scaled NUQ keys. 2 unset (where the calibration has their tables), 1 required,
// 0 per channel alone, -1 another value.
GGML_EXT_API int ggml_ext_settings_kv_kblock(void);
// GGML_EXT_KV_VTABLE: which value tables a NUQ V cache binds.
enum { GGML_EXT_KV_VTABLE_AUTO = 0, GGML_EXT_KV_VTABLE_BLOCK = 1, GGML_EXT_KV_VTABLE_TOKEN = 2 };
GGML_EXT_API int ggml_ext_settings_kv_vtable(void);  // GGML_EXT_KV_VTABLE_*, -1 another value
// GGML_EXT_KV_ATTN: when the KVQuant decode op runs (any other value: auto).
enum { GGML_EXT_KV_ATTN_AUTO = 0, GGML_EXT_KV_ATTN_REF = 1, GGML_EXT_KV_ATTN_FUSED = 2, GGML_EXT_KV_ATTN_CHECK = 3 };
GGML_EXT_API int ggml_ext_settings_kv_attn(void);
// GGML_EXT_KV_ATTN_SPLIT: the CUDA decode op's lane kernel, 0 (never: the block kernel) or 1; -1 unset or another value
// (the default: where it applies).
GGML_EXT_API int ggml_ext_settings_kv_attn_split(void);
// GGML_EXT_KVQ_DECODE=ref: the NUQ cache types' scalar block decoder where a SIMD one is compiled in.
GGML_EXT_API bool ggml_ext_settings_kvquant_decode_ref(void);
// GGML_EXT_CB_MMV=f32: the codebooks' f32 CUDA mat-vec instead of the integer one. Read once.
GGML_EXT_API bool ggml_ext_settings_codebooks_f32_mmv(void);
// GGML_EXT_DEC_LAUNCH: forces QDEC's CUDA launch (any other value: automatic).
enum { GGML_EXT_DEC_LAUNCH_AUTO = 0, GGML_EXT_DEC_LAUNCH_COOP = 1, GGML_EXT_DEC_LAUNCH_SPLIT = 2,
       GGML_EXT_DEC_LAUNCH_ONEPASS = 3 };
GGML_EXT_API int ggml_ext_settings_dec_launch(void);
// GGML_EXT_RUNTIME_REPACK: false for 0 / off / false / no (plain Q4_0 left to upstream's repack). Read once.
GGML_EXT_API bool ggml_ext_settings_runtime_repack(void);

#ifdef __cplusplus
}
#endif
