package ui

// ActionPaths returns the POST path of every action in the dashboard's table, so that
// the tests of package ui_test cover each action, however many the table lists.
func ActionPaths() []string {
	var paths []string
	for _, p := range dashboard() {
		for _, a := range p.actions {
			paths = append(paths, a.path)
		}
	}
	return paths
}
