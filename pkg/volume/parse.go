package volume

import "strings"

// Parse splits a unique volume name into its plugin and, for a CSI name, its
// driver and volume handle. It lets state recovered from node.status (where
// only names are kept) be attributed to a mechanism and a metric label.
func Parse(name Name) (plugin, driver, handle string) {
	s := string(name)
	if rest, ok := strings.CutPrefix(s, CSIPluginName+"/"); ok {
		driver, handle, _ = strings.Cut(rest, "^")
		return CSIPluginName, driver, handle
	}
	// "<vendor>/<plugin>/<id>": the plugin is the first two segments.
	first, rest, ok := strings.Cut(s, "/")
	if !ok {
		return s, "", ""
	}
	second, _, _ := strings.Cut(rest, "/")
	return first + "/" + second, "", ""
}

// MetricPluginName is the plugin_name label upstream uses for a volume:
// "kubernetes.io/csi:<driver>" for CSI (also migrated) volumes, the in-tree
// plugin name otherwise.
func MetricPluginName(name Name) string {
	plugin, driver, _ := Parse(name)
	if plugin == CSIPluginName {
		return plugin + ":" + driver
	}
	return plugin
}
