package bench

// The package's tests run the scale scenarios on tables a thousand times smaller, and
// schedules.lateness with 600 schedules (10 ticks a second).
func init() { scaleDivisor, latenessSchedules = 1000, 600 }
