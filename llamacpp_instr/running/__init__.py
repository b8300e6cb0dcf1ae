"""Running llama.cpp with a session open: `instr run` (`runner`), `instr serve` (`serve`), the
Python API (`api`), a program's child process (`child`), always-on sampling and rotation
(`always_on`), where the layers and tensors live (`offload`, `devices`, `rpc_endpoint`,
`tensor_overrides`), RPC stand-ins (`rpc_standin`), the Vulkan environment (`vulkan_env`) and the
memory budget a run is held to (`memory`)."""
