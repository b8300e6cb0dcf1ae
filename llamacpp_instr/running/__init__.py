"""Running llama.cpp with a session open, and everything that acts on a model or the machine.

``instr run`` (``runner``), ``instr serve`` (``serve``), the Python API (``api``), a program's
child process (``child``), always-on sampling and rotation (``always_on``), where the layers and
tensors live (the options as data: ``offload``, ``tensor_overrides``; made real in this process:
``placement``, ``devices``, ``rpc_endpoint``, ``tensor_buffers``), RPC stand-ins
(``rpc_standin``), the Vulkan environment (``vulkan_env``), the memory budget a run is held to
(``memory_budget``), an exporter started beside a program (``exporter_launch``), the machine's
measured peaks (``peak_probe``), the probes that time this machine for a prediction
(``probes/``), quantization: making, evaluating and sweeping quantized models (``quant/``), and a
server's recorded requests sent again to llama-server under other settings (``replay/``)."""
