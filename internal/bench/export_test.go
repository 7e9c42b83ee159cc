package bench

// The package's tests run the scale scenarios on tables a thousand times smaller.
func init() { scaleDivisor = 1000 }
