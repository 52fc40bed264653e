"""Array I/O with tensorstore: nbckpt's zarr arrays and Orbax's OCDBT arrays."""
