"""YOLOv5 model sizes by name, without importing torch: the runner checks a preset name before
any process starts."""

PRESETS: dict[str, tuple[float, float]] = {  # name -> (depth_multiple, width_multiple)
    "yolov5n": (0.33, 0.25), "yolov5s": (0.33, 0.50), "yolov5m": (0.67, 0.75),
    "yolov5l": (1.0, 1.0), "yolov5x": (1.33, 1.25),
}
MODEL_FREE = "none"  # no model: inference answers at once with no detections (the pipeline's own ceiling)
