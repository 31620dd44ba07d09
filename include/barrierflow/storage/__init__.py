"""Storage: URIs and conditional writes on local disks and S3, the Delta log, the warehouse layout, staged files."""
