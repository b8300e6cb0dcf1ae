"""The patched llama.cpp and what loads it: the pin (`pin`), where the patches and the cache
are (`paths`), the build of the wheel and of llama.cpp's own programs (`build`, by part: `sdist`,
`patching`, `build_plan`, `wheel`, `libraries`, `progress`; `tools`), the ctypes bindings of the
``llama_instr_*`` C API (`bindings`) and the bundled model (`models`)."""
