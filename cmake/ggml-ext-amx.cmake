# llama.cpp's AMX mat-mul (ggml-cpu/amx) is compiled in whenever -march=native finds AMX (Sapphire Rapids and
# later). In the Sapphire Rapids VMs this project is built and tested on, it dies with SIGILL at its first tile
# load (tileloadd, right after its own ldtilecfg) although the kernel grants AMX (arch_prctl succeeds, XCR0 has
# the tile bits); the pristine build from scripts/build_upstream.sh dies the same way. So builds leave it out
# unless GGML_EXT_AMX=ON: -U of the compiler's AMX macros compiles out ggml's AMX code whatever -march says
# (the rest of -march=native stays). scripts/build_upstream.sh passes the same flags, so baselines stay like for
# like. Included before llama.cpp's add_subdirectory, so every ggml target gets it.
option(GGML_EXT_AMX "Keep llama.cpp's AMX mat-mul where -march=native enables AMX" OFF)
if (NOT GGML_EXT_AMX AND NOT MSVC AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-U__AMX_TILE__;-U__AMX_INT8__;-U__AMX_BF16__>")
endif()
