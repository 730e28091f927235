// Package profiles ships netload's example profiles: the five seed-002
// workloads (identical to what `netload run --workload NAME` runs) and a
// few examples of other uperf features.
package profiles

import "embed"

// FS holds every *.xml file of this directory.
//
//go:embed *.xml
var FS embed.FS
