package bench

import "time"

// stopTimeout bounds a controller's graceful stop before its process group
// is killed.
const stopTimeout = 15 * time.Second
