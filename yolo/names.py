"""Class names: the 80 COCO classes in YOLOv5 order, and placeholders for other datasets."""

COCO_NAMES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich",
    "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote",
    "keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book",
    "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)


def default_names(nc: int) -> list[str]:
    """Return class names for a model with ``nc`` classes.

    Args:
        nc (int): number of classes, positive.

    Returns:
        list[str]: :data:`COCO_NAMES` when ``nc == 80``, else ``["class0", ..., "class{nc-1}"]``.
    """
    if nc <= 0:
        raise ValueError(f"expected a positive number of classes, got {nc}")
    if nc == len(COCO_NAMES):
        return list(COCO_NAMES)
    return [f"class{i}" for i in range(nc)]
