"""Starting, stopping and switching one engine: the operation's ticket and the controller's options
(`tickets`), the engine lock across processes (`oplock`), the preflight checks (`preflight`), the wait for
the GPU's memory to be released (`gpurelease`) and the drain shared with other processes (`answers`,
`drainnote`). The controller's operations and boot use them; they know nothing of its threads."""
