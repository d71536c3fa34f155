package cache

// PodKeys returns the keys a pod wants, by its "namespace/name" key.
func (d *DesiredState) PodKeys(podKey string) []Key {
	d.mu.RLock()
	defer d.mu.RUnlock()
	p := d.pods[podKey]
	if p == nil {
		return nil
	}
	keys := make([]Key, 0, len(p.specs))
	for _, s := range p.specs {
		keys = append(keys, Key{Volume: s.Name, Node: p.node})
	}
	return keys
}
