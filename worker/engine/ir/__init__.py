"""The engine's graph IR: an SSA graph over ONNX with exact use lists and an op-type index."""
from worker.engine.ir.graph import Graph, Names
from worker.engine.ir.model import Model
from worker.engine.ir.node import Attr, Node
from worker.engine.limits import Limits
from worker.engine.ir.serde import SaveInfo, load_model, model_to_proto, save_model
from worker.engine.ir.value import Shape, Use, Value

__all__ = ["Attr", "Graph", "Limits", "Model", "Names", "Node", "SaveInfo", "Shape", "Use", "Value",
           "load_model", "model_to_proto", "save_model"]
