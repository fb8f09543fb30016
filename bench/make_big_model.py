"""Build a large real-architecture model for memory and speed benchmarks.

light_vgg19 from the onnx package computes its weights with ConstantOfShape nodes; replacing each one by an
initializer of the same shape and fill value (seeded random values when --random, so the weights do not
compress and cannot be shared) gives VGG-19 with its full 548 MB of float32 weights.

Usage: python bench/make_big_model.py OUT.onnx [--random]
"""
import argparse
import os

import numpy as np
import onnx
from onnx import numpy_helper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--random", action="store_true", help="seeded random weights instead of the fill value")
    args = parser.parse_args()
    light = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_vgg19.onnx")
    model = onnx.load(light)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    kept = []
    for node in model.graph.node:
        if node.op_type != "ConstantOfShape":
            kept.append(node)
            continue
        shape = [int(d) for d in inits[node.input[0]]]
        fill = numpy_helper.to_array(node.attribute[0].t).reshape(-1)[0] if node.attribute else np.float32(0)
        if args.random:
            data = (rng.standard_normal(shape, dtype=np.float32) * 0.01).astype(np.float32)
        else:
            data = np.full(shape, fill, dtype=np.float32)
        model.graph.initializer.append(numpy_helper.from_array(data, node.output[0]))
    del model.graph.node[:]
    model.graph.node.extend(kept)
    onnx.save(model, args.output)
    print(f"{args.output}: {os.path.getsize(args.output) / 1e6:.1f} MB, {len(kept)} nodes")


if __name__ == "__main__":
    main()
