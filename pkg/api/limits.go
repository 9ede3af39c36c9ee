package api

// MaxBatchItems is the most items one batch holds (BatchRequest's items,
// maxItems in schemas/openapi.yaml).
const MaxBatchItems = 5000

// MaxDiffCeiling is the most a cell's diff cap (ASSAY_MAX_DIFF_BYTES) may
// be: the input schema's cap on a diff.
const MaxDiffCeiling = 8 << 20
