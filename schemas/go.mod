module assay.dev/schemas

go 1.26.5
