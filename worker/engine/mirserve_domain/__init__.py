"""The project's own ONNX domain, ``mirserve``: the op registry (``ops``), the fused ops (``fused``), and the
function bodies that define them in standard ops (``body``, ``activations``)."""
