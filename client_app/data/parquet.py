"""``dataset-path``: a local folder with ``train.parquet`` and ``test.parquet``, each with an int
``label`` column and an ``image`` column holding either encoded images (``{"bytes": ...}`` as
written by ``datasets``) or numeric 2-D (H×W) / 3-D (H×W×C) arrays, and optionally a
``writer_id`` column. Every defect of a file is one :class:`DataError` line naming the file, the
problem and the fix (:func:`read_parquet`); train and test images must have one shape."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from client_app.data.base import (
    DEFAULT_MAX_CLASSES,
    DEFAULT_MAX_FILE_BYTES,
    WRITER_COLUMN,
    Arrays,
    DataError,
    check_file,
    images_to_nchw,
)

# Bounds checked before anything is allocated: at most MAX_IMAGE_VALUES values per
# example and MAX_DATA_BYTES of float32 examples per file.
MAX_IMAGE_VALUES = 1 << 20  # e.g. 1024×1024 grey or 591×591×3; 2000×2000 is refused
MAX_DATA_BYTES = 8 << 30


def read_parquet(folder: Path, split: str, max_classes: int = DEFAULT_MAX_CLASSES,
                 max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Arrays:
    """``folder/<split>.parquet`` as (x N×C×H×W float32, int64 labels, writer ids or None).

    Every defect of the file is one :class:`DataError` line naming the file, the problem and
    the fix: not a parquet file (corrupt, truncated), no rows, a missing column, labels that
    are not integer class ids (strings, fractions, missing, negative, beyond the classes the
    file's ``datasets`` metadata declares), missing images, images of differing shapes within
    the file, NaN or infinite pixels. Only a regular file of at most ``max_bytes``
    (``max-file-bytes``) is read: a FIFO, a device or a bigger file is one line."""
    path = folder / f"{split}.parquet"
    if not path.exists():
        raise DataError(
            f"dataset-path: {path} not found; the folder needs train.parquet and test.parquet "
            "with columns 'image' and 'label' (or LEAF's train/*.json and test/*.json)"
        )
    try:
        check_file(path, max_bytes)
    except OSError as exc:
        raise DataError(f"dataset-path: {path} cannot be read [{type(exc).__name__}: {exc.strerror}]: check the "
                        "file and its permissions") from None
    table = _read_table(path)
    for col in ("image", "label"):
        if col not in table.column_names:
            raise DataError(f"dataset-path: {path} has no '{col}' column (has {table.column_names})")
    if table.num_rows == 0:
        raise DataError(f"dataset-path: {path} has no rows: the {split} split needs examples "
                        "(write them into the file, or point dataset-path at the right folder)")
    labels = _labels(table, path, max_classes)
    writers = (table.column(WRITER_COLUMN).to_numpy(zero_copy_only=False)
               if WRITER_COLUMN in table.column_names else None)
    column = table.column("image")
    if column.null_count:
        raise DataError(f"dataset-path: {path} column 'image': {column.null_count} missing (null) image(s), "
                        f"first at row {_first_true(column.is_null())}: drop those rows or fill them in")
    _check_image_size(column, path)
    numeric = numeric_lists(column)
    if numeric is None:  # encoded images, ragged or nested lists with missing values
        numeric = _pylist_images(column, path)
    _check_finite(numeric, path)
    try:
        return images_to_nchw(numeric), labels, writers
    except DataError as exc:
        raise DataError(f"dataset-path: {path} column 'image': {exc}") from None


def _too_big(path: Path, what: str) -> DataError:
    return DataError(f"dataset-path: {path} {what}: downsample or crop the images, or split the data over "
                     "several runs")


def _check_image_size(column, path: Path) -> None:
    """Before the images become one float32 array: the first image at most MAX_IMAGE_VALUES
    values and all of them at most MAX_DATA_BYTES (nested lists; encoded images are checked
    from their headers as they are decoded)."""
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(arr) == 0 or not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
                             or pa.types.is_fixed_size_list(arr.type)):
        return
    first = arr.slice(0, 1)
    while pa.types.is_list(first.type) or pa.types.is_large_list(first.type) or pa.types.is_fixed_size_list(first.type):
        first, arr = first.flatten(), arr.flatten()
    if len(first) > MAX_IMAGE_VALUES:
        raise _too_big(path, f"column 'image': row 0 holds {len(first):,} values, above the bound of "
                             f"{MAX_IMAGE_VALUES:,} per image")
    if 4 * len(arr) > MAX_DATA_BYTES:
        raise _too_big(path, f"column 'image': {len(arr):,} values in all, {4 * len(arr) / 2**30:.1f} GiB as float32, "
                             f"above the bound of {MAX_DATA_BYTES / 2**30:.0f} GiB")


def _read_table(path: Path):
    """The parquet file as a pyarrow Table; a file pyarrow cannot read is one line; one whose
    uncompressed data exceeds MAX_DATA_BYTES is refused from its footer, before reading."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except (pa.ArrowException, OSError, ValueError):
        size = 0  # unreadable: read_table below says why
    if size > MAX_DATA_BYTES:
        raise _too_big(path, f"holds {size / 2**30:.1f} GiB uncompressed, above the bound of "
                             f"{MAX_DATA_BYTES / 2**30:.0f} GiB")
    try:
        return pq.read_table(path, page_checksum_verification=True)  # checks the CRCs a writer stored
    except (pa.ArrowException, OSError, ValueError) as exc:  # ArrowInvalid: not parquet, truncated, corrupt
        cause = (str(exc).strip().splitlines() or [""])[0].replace(f"'{path}'", "it")[:200]
        raise DataError(
            f"dataset-path: {path} is not a readable parquet file [{type(exc).__name__}: {cause}]: it is "
            "corrupt or truncated; write it again (pyarrow.parquet.write_table or datasets' "
            "Dataset.to_parquet) or copy it again"
        ) from None


def _first_true(mask) -> int:
    """Index of the first true entry of a boolean numpy or pyarrow array."""
    return int(np.argmax(np.asarray(mask, dtype=bool)))


def _declared_classes(schema) -> int | None:
    """The number of classes the file's ``datasets`` metadata declares for 'label' (a
    ClassLabel with names), else None."""
    import json

    meta = (schema.metadata or {}).get(b"huggingface")
    try:
        feature = json.loads(meta)["info"]["features"]["label"] if meta else {}
    except (ValueError, KeyError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
    return len(names) if isinstance(names, list) and names else None


def _labels(table, path: Path, max_classes: int = DEFAULT_MAX_CLASSES) -> np.ndarray:
    """The 'label' column as int64 class ids 0..K-1, or one :class:`DataError` line."""
    import pyarrow as pa

    column = table.column("label")
    where = f"dataset-path: {path} column 'label'"
    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if column.null_count:
        raise DataError(f"{where}: {column.null_count} missing (null) label(s), first at row "
                        f"{_first_true(column.is_null())}: drop those rows or give them a class id")
    if pa.types.is_integer(kind):
        labels = column.to_numpy().astype(np.int64)
    elif pa.types.is_floating(kind):
        values = column.to_numpy()
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            row = _first_true(bad)
            raise DataError(f"{where}: labels must be integer class ids, row {row} holds {values[row].item()!r} "
                            f"({int(bad.sum())} such row(s)): write the labels as integers 0..K-1")
        labels = values.astype(np.int64)
    else:
        first = column.slice(0, 1).to_pylist()[0]
        raise DataError(f"{where} holds {kind} values (e.g. {first!r}), not integer class ids: map them to "
                        "0..K-1 first (e.g. datasets' Dataset.class_encode_column('label'))")
    if labels.min() < 0:
        row = _first_true(labels < 0)
        raise DataError(f"{where}: label {labels[row]} at row {row} is negative ({int((labels < 0).sum())} such "
                        "row(s)): class ids must be 0..K-1")
    if labels.max() >= max_classes:
        row = _first_true(labels >= max_classes)
        raise DataError(f"{where}: label {labels[row]} at row {row} is not below max-classes = {max_classes} "
                        f"({int((labels >= max_classes).sum())} such row(s)): class ids must be 0..K-1 (raise "
                        "max-classes if K really is that large)")
    declared = _declared_classes(table.schema)
    if declared is not None and labels.max() >= declared:
        row = _first_true(labels >= declared)
        raise DataError(f"{where}: label {labels[row]} at row {row} is out of range: the file declares "
                        f"{declared} classes (ClassLabel), so class ids must be 0..{declared - 1}")
    return labels


def _pylist_images(column, path: Path) -> np.ndarray:
    """The slow path: encoded images (``{"bytes": ...}`` as written by ``datasets``) or nested
    lists, decoded one by one, as one float32 array; differing shapes are one line naming the
    first row that differs from row 0."""
    images = column.to_pylist()
    if isinstance(images[0], dict):  # encoded image as written by `datasets`
        from PIL import Image

        decoded, total = [], 0
        for row, im in enumerate(images):
            try:
                image = Image.open(io.BytesIO(im["bytes"]))  # reads the header only
                values = image.size[0] * image.size[1] * len(image.getbands())
            except Exception as exc:  # noqa: BLE001 - PIL raises several types for undecodable bytes
                raise DataError(f"dataset-path: {path} column 'image': row {row} cannot be decoded as an image "
                                f"[{type(exc).__name__}]: re-encode it (PNG/JPEG bytes) or drop the row") from None
            if values > MAX_IMAGE_VALUES:
                raise _too_big(path, f"column 'image': row {row} is a {image.size[0]}×{image.size[1]} image of "
                                     f"{values:,} values, above the bound of {MAX_IMAGE_VALUES:,} per image")
            total += values
            if 4 * total > MAX_DATA_BYTES:
                raise _too_big(path, f"column 'image': the images up to row {row} hold {total:,} values, above the "
                                     f"bound of {MAX_DATA_BYTES / 2**30:.0f} GiB as float32")
            try:
                decoded.append(np.asarray(image))
            except Exception as exc:  # noqa: BLE001 - PIL raises several types for undecodable bytes
                raise DataError(f"dataset-path: {path} column 'image': row {row} cannot be decoded as an image "
                                f"[{type(exc).__name__}]: re-encode it (PNG/JPEG bytes) or drop the row") from None
        images = decoded
    try:
        return np.asarray(images, dtype=np.float32)
    except (ValueError, TypeError):
        pass
    shapes = []
    for row, im in enumerate(images):
        try:
            shapes.append(np.asarray(im, dtype=np.float32).shape)
        except (ValueError, TypeError):
            raise DataError(f"dataset-path: {path} column 'image': the image at row {row} is ragged (rows of "
                            "differing lengths) or not numeric: every image must be an H×W or H×W×C array") from None
        if shapes[-1] != shapes[0]:
            raise DataError(f"dataset-path: {path} column 'image': images do not all have the same shape: row 0 is "
                            f"{_shape(shapes[0])}, row {row} is {_shape(shapes[-1])}; resize or crop them to one "
                            "shape")
    raise DataError(f"dataset-path: {path} column 'image': the images cannot be read as one numeric array")


def _shape(shape: tuple[int, ...]) -> str:
    return "×".join(map(str, shape)) or "a scalar"


def _check_finite(images: np.ndarray, path: Path) -> None:
    """NaN or ±inf pixels are one line: how many images hold them and the first row."""
    if images.size == 0 or (np.isfinite(images.min()) and np.isfinite(images.max())):  # no full-size mask
        return
    flat = images.reshape(len(images), -1)
    bad = ~np.isfinite(flat).all(axis=1)  # the images holding a non-finite pixel
    row = _first_true(bad)
    nan, inf = int(np.isnan(flat[bad]).sum()), int(np.isinf(flat[bad]).sum())
    raise DataError(f"dataset-path: {path} column 'image': {nan} NaN and {inf} infinite pixel value(s) in "
                    f"{int(bad.sum())} of {len(images)} image(s), first at row {row}: fix or drop those images "
                    "(pixels must be finite numbers)")


def check_same_shape(train: Arrays, test: Arrays | None, folder: Path) -> None:
    """The train and test images must have one shape (the model takes one input shape)."""
    if test is not None and train[0].shape[1:] != test[0].shape[1:]:
        raise DataError(
            f"dataset-path: images in {folder / 'train.parquet'} are {_shape(train[0].shape[1:])} (C×H×W) but in "
            f"{folder / 'test.parquet'} {_shape(test[0].shape[1:])}: resize/convert both splits to one shape "
            "(and one number of channels)"
        )


def numeric_lists(column) -> np.ndarray | None:
    """A column of equal-shape nested numeric lists as one float32 array, else None.

    The same values as ``np.asarray(column.to_pylist(), dtype=np.float32)``, without
    building a Python object per pixel (seconds per process for CIFAR-sized data).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    shape = [len(arr)]
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if arr.null_count or len(arr) == 0:
            return None
        lengths = pc.list_value_length(arr)
        lo, hi = pc.min(lengths).as_py(), pc.max(lengths).as_py()
        if lo != hi:
            return None  # ragged: the slow path reports the shape error
        shape.append(lo)
        arr = arr.flatten()
    if len(shape) < 3 or not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)) or arr.null_count:
        return None
    return arr.to_numpy(zero_copy_only=False).astype(np.float32).reshape(shape)
