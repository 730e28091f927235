module kvmtune/netload

go 1.22
