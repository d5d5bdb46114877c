CREATE TABLE term_calendar ( -- the registrar's calendar (one row): simulated today and the add/drop deadline
  id INTEGER PRIMARY KEY CHECK (id = 1),
  today DATE NOT NULL, -- today's date YYYY-MM-DD
  current_term TEXT NOT NULL, -- the term in progress, e.g. 2025-FA
  add_drop_deadline DATE NOT NULL, -- last day to add or drop sections of the current term
  registration_term TEXT NOT NULL -- the next term, open for registration, e.g. 2026-SP
);

CREATE TABLE student ( -- students registered at the university
  student_id TEXT PRIMARY KEY NOT NULL, -- e.g. S-1001
  name TEXT NOT NULL,
  email TEXT NOT NULL,
  program TEXT NOT NULL, -- major, e.g. Computer Science
  year INTEGER NOT NULL CHECK (year BETWEEN 1 AND 6), -- year of study
  standing TEXT NOT NULL DEFAULT 'good' CHECK (standing IN ('good', 'probation', 'suspended')) -- academic standing, set by the dean's office
);

CREATE TABLE course ( -- the course catalogue
  course_code TEXT PRIMARY KEY NOT NULL, -- e.g. CS-201
  title TEXT NOT NULL,
  credits INTEGER NOT NULL CHECK (credits BETWEEN 1 AND 6),
  department TEXT NOT NULL
);

CREATE TABLE prerequisite ( -- courses that must be passed before taking a course
  course_code TEXT NOT NULL REFERENCES course(course_code), -- the course that has the prerequisite
  requires_code TEXT NOT NULL REFERENCES course(course_code), -- the course that must be passed first
  PRIMARY KEY (course_code, requires_code)
);

CREATE TABLE section ( -- scheduled sections of a course in a term
  section_id INTEGER PRIMARY KEY, -- 5-digit section number, e.g. 40201
  course_code TEXT NOT NULL REFERENCES course(course_code),
  term TEXT NOT NULL, -- e.g. 2026-SP
  instructor TEXT NOT NULL,
  capacity INTEGER NOT NULL CHECK (capacity >= 1), -- most enrolled students
  status TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed', 'cancelled')),
  meeting_days TEXT NOT NULL CHECK (meeting_days IN ('MW', 'TR', 'F')), -- MW, TR or F
  meeting_slot TEXT NOT NULL CHECK (meeting_slot IN ('08:00', '10:00', '13:00', '15:00')) -- start time
);

CREATE TABLE enrollment ( -- a student's place in a section (enrolled, on the waitlist, or dropped)
  student_id TEXT NOT NULL REFERENCES student(student_id),
  section_id INTEGER NOT NULL REFERENCES section(section_id),
  status TEXT NOT NULL DEFAULT 'enrolled' CHECK (status IN ('enrolled', 'waitlisted', 'dropped')),
  grade TEXT CHECK (grade IN ('A', 'B', 'C', 'D', 'F')), -- final grade; empty until graded
  waitlist_position INTEGER, -- place on the section's waitlist (set by the system while waitlisted)
  registered_on DATE, -- date the enrollment was made (set by the system)
  PRIMARY KEY (student_id, section_id)
);

-- New enrollments (enrolling or joining a waitlist)

CREATE TRIGGER enrollment_new_rules
BEFORE INSERT ON enrollment
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: grade_recording: a new enrollment carries no grade')
  WHERE NEW.grade IS NOT NULL;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: status_flow: new enrollments are enrolled or waitlisted')
  WHERE NEW.status NOT IN ('enrolled', 'waitlisted');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_suspended_enrollment: suspended students cannot enroll or join a waitlist')
  WHERE (SELECT standing FROM student WHERE student_id = NEW.student_id) = 'suspended';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: add_drop_deadline: sections can be added only in the registration term, or in the current term up to its add/drop deadline')
  FROM section s, term_calendar cal
  WHERE s.section_id = NEW.section_id
    AND (s.term NOT IN (cal.current_term, cal.registration_term)
         OR (s.term = cal.current_term AND cal.today > cal.add_drop_deadline));
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: section_open: closed and cancelled sections take no new students')
  WHERE NOT EXISTS (SELECT 1 FROM section WHERE section_id = NEW.section_id AND status = 'open');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: one_section_per_course: a student can hold only one section of a course per term')
  WHERE EXISTS (SELECT 1
                FROM enrollment e
                JOIN section mine ON mine.section_id = e.section_id
                JOIN section target ON target.section_id = NEW.section_id
                WHERE e.student_id = NEW.student_id
                  AND e.status IN ('enrolled', 'waitlisted')
                  AND mine.course_code = target.course_code
                  AND mine.term = target.term);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: prerequisites_met: every prerequisite of the course must have been passed (A-D) first')
  WHERE EXISTS (SELECT 1
                FROM prerequisite p
                WHERE p.course_code = (SELECT course_code FROM section WHERE section_id = NEW.section_id)
                  AND NOT EXISTS (SELECT 1
                                  FROM enrollment done
                                  JOIN section ds ON ds.section_id = done.section_id
                                  WHERE done.student_id = NEW.student_id
                                    AND ds.course_code = p.requires_code
                                    AND done.status = 'enrolled'
                                    AND done.grade IN ('A', 'B', 'C', 'D')));
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: section_capacity: the section is full; the student can join its waitlist instead')
  WHERE NEW.status = 'enrolled'
    AND (SELECT COUNT(*) FROM enrollment WHERE section_id = NEW.section_id AND status = 'enrolled')
        >= (SELECT capacity FROM section WHERE section_id = NEW.section_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: section_capacity: the waitlist is only for full sections; the student can enroll directly')
  WHERE NEW.status = 'waitlisted'
    AND (SELECT COUNT(*) FROM enrollment WHERE section_id = NEW.section_id AND status = 'enrolled')
        < (SELECT capacity FROM section WHERE section_id = NEW.section_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: credit_load: enrolled credits in a term cannot exceed 18 (12 on probation)')
  FROM student st, section s, course c
  WHERE NEW.status = 'enrolled'
    AND st.student_id = NEW.student_id
    AND s.section_id = NEW.section_id
    AND c.course_code = s.course_code
    AND c.credits + (SELECT COALESCE(SUM(oc.credits), 0)
                     FROM enrollment o
                     JOIN section os ON os.section_id = o.section_id
                     JOIN course oc ON oc.course_code = os.course_code
                     WHERE o.student_id = NEW.student_id AND o.status = 'enrolled' AND os.term = s.term)
        > CASE st.standing WHEN 'probation' THEN 12 ELSE 18 END;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: time_conflict: the student is already enrolled in a section meeting at the same days and time this term')
  WHERE NEW.status = 'enrolled'
    AND EXISTS (SELECT 1
                FROM enrollment o
                JOIN section os ON os.section_id = o.section_id
                JOIN section s ON s.section_id = NEW.section_id
                WHERE o.student_id = NEW.student_id
                  AND o.status = 'enrolled'
                  AND os.term = s.term
                  AND os.meeting_days = s.meeting_days
                  AND os.meeting_slot = s.meeting_slot);
END;

CREATE TRIGGER enrollment_after_new
AFTER INSERT ON enrollment
BEGIN
  -- the registration date is set to today; a student joining a waitlist gets the section's next waitlist position
  UPDATE enrollment
  SET registered_on = (SELECT today FROM term_calendar),
      waitlist_position = CASE WHEN NEW.status = 'waitlisted'
                               THEN (SELECT COALESCE(MAX(waitlist_position), 0) + 1 FROM enrollment
                                     WHERE section_id = NEW.section_id)
                               ELSE NULL END
  WHERE student_id = NEW.student_id AND section_id = NEW.section_id;
END;

-- Changes of an enrollment

CREATE TRIGGER enrollment_dropped_final
BEFORE UPDATE ON enrollment
WHEN OLD.status = 'dropped' AND (NEW.status IS NOT OLD.status OR NEW.grade IS NOT OLD.grade)
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: status_flow: a dropped enrollment is final and cannot be changed');
END;

CREATE TRIGGER enrollment_status_change
BEFORE UPDATE OF status ON enrollment
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: status_flow: a waitlisted enrollment can become enrolled or dropped, an enrolled one only dropped')
  WHERE NOT ((OLD.status = 'waitlisted' AND NEW.status IN ('enrolled', 'dropped'))
          OR (OLD.status = 'enrolled' AND NEW.status = 'dropped'));
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: grade_final: a graded enrollment cannot be dropped')
  WHERE NEW.status = 'dropped' AND OLD.grade IS NOT NULL;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: add_drop_deadline: sections can be added or dropped only in the registration term, or in the current term up to its add/drop deadline')
  WHERE NEW.status IN ('enrolled', 'dropped')
    AND EXISTS (SELECT 1 FROM section s, term_calendar cal
                WHERE s.section_id = NEW.section_id
                  AND CASE
                        WHEN s.term = cal.registration_term THEN 0
                        WHEN s.term = cal.current_term THEN julianday(cal.today) > julianday(cal.add_drop_deadline)
                        ELSE 1
                      END);
END;

CREATE TRIGGER enrollment_promotion_rules
BEFORE UPDATE OF status ON enrollment
WHEN OLD.status = 'waitlisted' AND NEW.status = 'enrolled'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_suspended_enrollment: suspended students cannot be moved from a waitlist into a section')
  WHERE EXISTS (SELECT 1 FROM student WHERE student_id = NEW.student_id AND standing = 'suspended');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: waitlist_seat_free: a waitlisted student can be moved in only when the section has a free seat')
  WHERE (SELECT s.capacity - COUNT(e.student_id)
         FROM section s LEFT JOIN enrollment e ON e.section_id = s.section_id AND e.status = 'enrolled'
         WHERE s.section_id = NEW.section_id
         GROUP BY s.section_id) <= 0;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: credit_load: enrolled credits in a term cannot exceed 18 (12 on probation)')
  WHERE (SELECT SUM(c.credits)
         FROM enrollment o
         JOIN section os ON os.section_id = o.section_id
         JOIN course c ON c.course_code = os.course_code
         WHERE o.student_id = NEW.student_id
           AND (o.status = 'enrolled' OR o.section_id = NEW.section_id)
           AND os.term = (SELECT term FROM section WHERE section_id = NEW.section_id))
        > (SELECT CASE standing WHEN 'probation' THEN 12 ELSE 18 END FROM student WHERE student_id = NEW.student_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: time_conflict: the student is already enrolled in a section meeting at the same days and time this term')
  WHERE EXISTS (SELECT 1
                FROM enrollment o
                JOIN section os ON os.section_id = o.section_id
                JOIN section s ON s.section_id = NEW.section_id
                WHERE o.student_id = NEW.student_id
                  AND o.status = 'enrolled'
                  AND o.section_id <> NEW.section_id
                  AND os.term = s.term
                  AND os.meeting_days || ' ' || os.meeting_slot = s.meeting_days || ' ' || s.meeting_slot);
END;

CREATE TRIGGER enrollment_grade_change
BEFORE UPDATE OF grade ON enrollment
WHEN NEW.grade IS NOT OLD.grade
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: grade_final: a recorded grade cannot be changed or removed')
  WHERE OLD.grade IS NOT NULL;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: grade_recording: grades are recorded only on enrolled enrollments')
  WHERE NEW.status <> 'enrolled' AND OLD.status <> 'dropped';
END;

CREATE TRIGGER enrollment_after_leave_waitlist
AFTER UPDATE OF status ON enrollment
WHEN OLD.status = 'waitlisted' AND NEW.status <> 'waitlisted'
BEGIN
  -- a student leaving the waitlist (moved into the section or dropped) gives up the waitlist position
  UPDATE enrollment SET waitlist_position = NULL
  WHERE student_id = NEW.student_id AND section_id = NEW.section_id;
END;

CREATE TRIGGER enrollment_after_drop
AFTER UPDATE OF status ON enrollment
WHEN OLD.status = 'enrolled' AND NEW.status = 'dropped'
BEGIN
  -- the freed seat goes to the first waitlisted student of the section who may be enrolled (not suspended, within the credit load, no time conflict)
  UPDATE enrollment SET status = 'enrolled'
  WHERE section_id = NEW.section_id
    AND student_id = (
      SELECT w.student_id
      FROM enrollment w
      JOIN student st ON st.student_id = w.student_id
      JOIN section s ON s.section_id = w.section_id
      JOIN course c ON c.course_code = s.course_code
      WHERE w.section_id = NEW.section_id
        AND w.status = 'waitlisted'
        AND st.standing <> 'suspended'
        AND c.credits + (SELECT COALESCE(SUM(oc.credits), 0)
                         FROM enrollment o
                         JOIN section os ON os.section_id = o.section_id
                         JOIN course oc ON oc.course_code = os.course_code
                         WHERE o.student_id = w.student_id AND o.status = 'enrolled' AND os.term = s.term)
            <= CASE st.standing WHEN 'probation' THEN 12 ELSE 18 END
        AND NOT EXISTS (SELECT 1
                        FROM enrollment o
                        JOIN section os ON os.section_id = o.section_id
                        WHERE o.student_id = w.student_id
                          AND o.status = 'enrolled'
                          AND os.term = s.term
                          AND os.meeting_days = s.meeting_days
                          AND os.meeting_slot = s.meeting_slot)
      ORDER BY w.waitlist_position
      LIMIT 1);
END;
