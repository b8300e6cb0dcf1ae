# llamacpp-instr: the overlay's sources in libllama, listed once here (src/CMakeLists.txt includes
# this file). Each is compiled on its own, as llama.cpp's core sources are, outside the unity build
# of its models.
set(LLAMA_INSTR_SOURCES
    llama-instr-api.cpp
    llama-instr-env.cpp
    llama-instr-experts.cpp
    llama-instr-gpu-marks.cpp
    llama-instr-graph.cpp
    llama-instr-json.cpp
    llama-instr-log.cpp
    llama-instr-media.cpp
    llama-instr-memory.cpp
    llama-instr-model.cpp
    llama-instr-ops.cpp
    llama-instr-ops-cpu.cpp
    llama-instr-ops-cuda.cpp
    llama-instr-ops-rpc.cpp
    llama-instr-ops-vulkan.cpp
    llama-instr-peaks.cpp
    llama-instr-process.cpp
    llama-instr-registry.cpp
    llama-instr-rpc.cpp
    llama-instr-sampling.cpp
    llama-instr-session.cpp
    llama-instr-stats.cpp
    llama-instr-step.cpp
    llama-instr-timing.cpp
)
# entry points for the tests and benchmarks only (allocation-failure injection, the overhead
# benchmark's eval callback), never in a shipped library: `instr build --testing`
set(LLAMA_INSTR_TESTING_SOURCES
    llama-instr-bench.cpp
    llama-instr-testing.cpp
)

# The op timers of every backend are compiled whatever the backends built: each reaches its
# backend through the backend's registry only (a proc address), and finds none in a build without it.
target_sources(llama PRIVATE ${LLAMA_INSTR_SOURCES})
set_source_files_properties(${LLAMA_INSTR_SOURCES} ${LLAMA_INSTR_TESTING_SOURCES}
    PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)

# the pin and patch set this library was built from (set by `instr build`)
set(LLAMA_INSTR_PATCH_HASH  "dev"     CACHE STRING "llamacpp-instr: hash of the pin, patches and overlay")
set(LLAMA_INSTR_LLAMA_COMMIT "unknown" CACHE STRING "llamacpp-instr: the pinned llama.cpp commit")
set_source_files_properties(llama-instr-api.cpp PROPERTIES COMPILE_DEFINITIONS
    "LLAMA_INSTR_PATCH_HASH=\"${LLAMA_INSTR_PATCH_HASH}\";LLAMA_INSTR_LLAMA_COMMIT=\"${LLAMA_INSTR_LLAMA_COMMIT}\"")

option(LLAMA_INSTR_TESTING "llamacpp-instr: add the test-only entry points" OFF)
if (LLAMA_INSTR_TESTING)
    target_sources(llama PRIVATE ${LLAMA_INSTR_TESTING_SOURCES})
    if (CMAKE_SYSTEM_NAME STREQUAL "Linux")
        # libllama's own code uses the operator new of llama-instr-testing.cpp, even when an
        # earlier library put libstdc++'s in the global scope
        target_link_options(llama PRIVATE -Wl,-Bsymbolic-functions)
    endif()
    # libstdc++'s assertions in llama_instr code, which also stop its std::string being taken from
    # libstdc++.so (an extern template there): unoptimized, as the sanitized builds are, each
    # string's allocation is then libllama's own, through the operator new above, and the
    # allocation-failure sweeps reach it
    set_property(SOURCE ${LLAMA_INSTR_SOURCES} APPEND PROPERTY COMPILE_DEFINITIONS _GLIBCXX_ASSERTIONS)
endif()
