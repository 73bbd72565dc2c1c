package repo

// RunInTx exposes runInTx to the external tests of the package.
var RunInTx = runInTx
