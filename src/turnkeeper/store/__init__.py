"""The run store on PostgreSQL: who owns a run and how far each of its turns got."""
